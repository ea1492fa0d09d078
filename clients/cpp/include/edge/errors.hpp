// Error codes of the edge runtime (docs/protocol.md, "Error codes"): the C++ twin of
// edge/errors.py's ErrorCode. Codes never change meaning and are never reused; a new one is
// added to edge/errors.py and here together (tests/clients/test_cpp_errors.py holds the two
// equal, names and numbers, both ways).
//
// 1xxx: the request is invalid, sending it again as is fails again.
// 2xxx: valid but not served now, a retry may succeed.
// 3xxx: the server failed.
// 4xxx: boot failures (the process exits; these appear in logs, rarely on the wire).
#pragma once

namespace edge {

enum class ErrorCode : int {
    // 1xxx: malformed or invalid request (not recoverable by retrying as is)
    MALFORMED_FRAME = 1000,
    WRONG_FRAME_COUNT = 1001,
    UNSUPPORTED_VERSION = 1002,
    UNKNOWN_TYPE = 1003,
    INVALID_FIELD = 1004,
    EMPTY_TEXT = 1005,
    TEXT_TOO_LONG = 1006,
    TOO_MANY_TEXTS = 1007,
    INVALID_OPTION = 1008,
    TOO_MANY_TOKENS = 1009,
    FRAME_TOO_LARGE = 1010,
    DUPLICATE_REQUEST_ID = 1011,
    // 2xxx: flow control (valid request, not served now; a retry may succeed)
    OVERLOADED = 2000,
    DEADLINE_EXCEEDED = 2001,
    CANCELLED = 2002,
    SHUTTING_DOWN = 2003,
    NOT_READY = 2004,
    UNKNOWN_REQUEST_ID = 2005,
    BREAKER_OPEN = 2006,
    // 3xxx: server failures
    INTERNAL = 3000,
    ENGINE_FAILED = 3001,
    // 4xxx: boot failures
    PACKAGE_INVALID = 4000,
    PACKAGE_FILE_MISSING = 4001,
    PACKAGE_HASH_MISMATCH = 4002,
    PACKAGE_SIZE_MISMATCH = 4003,
    TOKENIZER_INVALID = 4010,
    TOKENIZER_UNSUPPORTED = 4011,
    ENGINE_UNAVAILABLE = 4020,
    ENGINE_LOAD_FAILED = 4021,
    BOOT_STAGE_FAILED = 4030,
    SNAPSHOT_STALE = 4031,
    METRICS_UNAVAILABLE = 4032,
};

// The thousands range of a code: edge/errors.py's RequestError, FlowError, InternalError,
// BootError.
enum class ErrorClass : int {
    Unknown = 0,
    Request = 1,
    Flow = 2,
    Internal = 3,
    Boot = 4,
};

inline constexpr ErrorClass error_class(int code) noexcept {
    return (code >= 1000 && code < 5000) ? static_cast<ErrorClass>(code / 1000) : ErrorClass::Unknown;
}

inline constexpr ErrorClass error_class(ErrorCode code) noexcept { return error_class(static_cast<int>(code)); }

// Whether a retry may succeed: flow errors and server failures (edge/errors.py's `recoverable`).
inline constexpr bool recoverable(int code) noexcept {
    return error_class(code) == ErrorClass::Flow || error_class(code) == ErrorClass::Internal;
}

inline constexpr bool recoverable(ErrorCode code) noexcept { return recoverable(static_cast<int>(code)); }

// The code's name as the server spells it ("OVERLOADED"); nullptr for a code this header does
// not know (a newer server's).
inline constexpr const char* error_name(ErrorCode code) noexcept {
    switch (code) {
        case ErrorCode::MALFORMED_FRAME: return "MALFORMED_FRAME";
        case ErrorCode::WRONG_FRAME_COUNT: return "WRONG_FRAME_COUNT";
        case ErrorCode::UNSUPPORTED_VERSION: return "UNSUPPORTED_VERSION";
        case ErrorCode::UNKNOWN_TYPE: return "UNKNOWN_TYPE";
        case ErrorCode::INVALID_FIELD: return "INVALID_FIELD";
        case ErrorCode::EMPTY_TEXT: return "EMPTY_TEXT";
        case ErrorCode::TEXT_TOO_LONG: return "TEXT_TOO_LONG";
        case ErrorCode::TOO_MANY_TEXTS: return "TOO_MANY_TEXTS";
        case ErrorCode::INVALID_OPTION: return "INVALID_OPTION";
        case ErrorCode::TOO_MANY_TOKENS: return "TOO_MANY_TOKENS";
        case ErrorCode::FRAME_TOO_LARGE: return "FRAME_TOO_LARGE";
        case ErrorCode::DUPLICATE_REQUEST_ID: return "DUPLICATE_REQUEST_ID";
        case ErrorCode::OVERLOADED: return "OVERLOADED";
        case ErrorCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
        case ErrorCode::CANCELLED: return "CANCELLED";
        case ErrorCode::SHUTTING_DOWN: return "SHUTTING_DOWN";
        case ErrorCode::NOT_READY: return "NOT_READY";
        case ErrorCode::UNKNOWN_REQUEST_ID: return "UNKNOWN_REQUEST_ID";
        case ErrorCode::BREAKER_OPEN: return "BREAKER_OPEN";
        case ErrorCode::INTERNAL: return "INTERNAL";
        case ErrorCode::ENGINE_FAILED: return "ENGINE_FAILED";
        case ErrorCode::PACKAGE_INVALID: return "PACKAGE_INVALID";
        case ErrorCode::PACKAGE_FILE_MISSING: return "PACKAGE_FILE_MISSING";
        case ErrorCode::PACKAGE_HASH_MISMATCH: return "PACKAGE_HASH_MISMATCH";
        case ErrorCode::PACKAGE_SIZE_MISMATCH: return "PACKAGE_SIZE_MISMATCH";
        case ErrorCode::TOKENIZER_INVALID: return "TOKENIZER_INVALID";
        case ErrorCode::TOKENIZER_UNSUPPORTED: return "TOKENIZER_UNSUPPORTED";
        case ErrorCode::ENGINE_UNAVAILABLE: return "ENGINE_UNAVAILABLE";
        case ErrorCode::ENGINE_LOAD_FAILED: return "ENGINE_LOAD_FAILED";
        case ErrorCode::BOOT_STAGE_FAILED: return "BOOT_STAGE_FAILED";
        case ErrorCode::SNAPSHOT_STALE: return "SNAPSHOT_STALE";
        case ErrorCode::METRICS_UNAVAILABLE: return "METRICS_UNAVAILABLE";
    }
    return nullptr;
}

}  // namespace edge
