// A header-only C++17 client of the edge runtime's serving socket (docs/protocol.md, version 1).
//
//     edge::Client client("ipc:///run/edge/edge.sock");
//     edge::EmbedResult r = client.embed({"a conveyor belt", "ein Förderband"});
//     const float* first = r.row(0);   // r.dim floats, L2-normalised
//
// Dependencies: libzmq 4.x with cppzmq (zmq.hpp, zmq_addon.hpp; Debian's cppzmq-dev) and
// msgpack-c's C++ headers (msgpack.hpp; Debian's libmsgpack-cxx-dev), used without Boost
// (MSGPACK_NO_BOOST). clients/cpp/CMakeLists.txt makes the target edge::client.
//
// The same semantics as the Python client, edge/ipc/client.py:
//  * one DEALER socket per client; requests are msgpack, two frames (header, body);
//  * a request waits `timeout` for its reply; when none comes, the socket is closed (linger 0)
//    and a new one opened, the ZeroMQ guide's "lazy pirate": a late reply goes to the closed
//    connection and is dropped there, never taken for the next request's. With `retries` > 0 the
//    request is then sent again on the new socket, up to `retries` more times, before a
//    TimeoutError (the Python client's default is no retry: retries = 0);
//  * every infer carries a request_id unique in this client's life (1, 2, 3, ...), and a reply
//    is matched to its request by that id, never by arrival order;
//  * an error reply is thrown as edge::Error, with its code (edge/errors.hpp), name, message
//    and trace_id;
//  * a SHUTTING_DOWN reply to embed() comes from a runtime that is going and did not run the
//    request (an update's handover: the new runtime holds the address already). When nothing
//    else is in flight on the connection, it is closed, a new one opened (which reaches whoever
//    holds the address now) and the request sent again there, once; a second SHUTTING_DOWN, or
//    one with other requests in flight (a reset would drop them), is thrown. Python's EdgeClient
//    connects again after it too; the gateway's pool sends again, like this.
//
// A Client is not thread-safe (neither is a ZeroMQ socket): use one per thread.
#pragma once

#include <edge/errors.hpp>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace edge {

using Milliseconds = std::chrono::milliseconds;

inline constexpr int kProtocolVersion = 1;

// An error reply of the server.
class Error : public std::runtime_error {
public:
    Error(int code, std::string name, std::string message, std::string trace_id,
          std::optional<std::uint64_t> request_id)
        : std::runtime_error("[" + std::to_string(code) + " " + name + "] " + message),
          code_(code), name_(std::move(name)), message_(std::move(message)), trace_id_(std::move(trace_id)),
          request_id_(request_id) {}

    // The code as the enum; a code this header does not know keeps its number (compare
    // code_value(), and error_name() returns nullptr for it).
    ErrorCode code() const noexcept { return static_cast<ErrorCode>(code_); }
    int code_value() const noexcept { return code_; }
    const std::string& name() const noexcept { return name_; }
    const std::string& message() const noexcept { return message_; }
    const std::string& trace_id() const noexcept { return trace_id_; }  // `edge trace TRACE_ID` on the device
    std::optional<std::uint64_t> request_id() const noexcept { return request_id_; }
    ErrorClass error_class() const noexcept { return edge::error_class(code_); }
    bool recoverable() const noexcept { return edge::recoverable(code_); }

private:
    int code_;
    std::string name_, message_, trace_id_;
    std::optional<std::uint64_t> request_id_;
};

// No reply within the timeout, after every attempt (the connection has been reset).
class TimeoutError : public std::runtime_error {
public:
    TimeoutError(const std::string& address, Milliseconds timeout, int attempts)
        : std::runtime_error("no reply from " + address + " within " + std::to_string(timeout.count()) + " ms" +
                             (attempts > 1 ? " (" + std::to_string(attempts) + " attempts)" : std::string())),
          timeout_(timeout), attempts_(attempts) {}
    Milliseconds timeout() const noexcept { return timeout_; }
    int attempts() const noexcept { return attempts_; }

private:
    Milliseconds timeout_;
    int attempts_;
};

// A reply this client cannot read (not protocol version 1, wrong frames, bad msgpack).
class ProtocolError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct ClientOptions {
    Milliseconds timeout{5000};  // how long one attempt waits for its reply
    int retries = 0;             // attempts after the first, each on a fresh socket
    // Called on each new socket before connect (also after a reset): e.g. to set
    // ZMQ_CURVE_SERVERKEY, ZMQ_CURVE_PUBLICKEY and ZMQ_CURVE_SECRETKEY for a tcp:// server
    // started with --keys (docs/protocol.md, "TCP and CURVE").
    std::function<void(zmq::socket_t&)> configure_socket;
};

// Options of one infer request; unset ones are not sent (the server's defaults apply).
struct EmbedOptions {
    std::optional<double> deadline_ms;    // server-side deadline, (0, 3600000] ms from arrival
    std::optional<int> priority;          // 0, 1 or 2; lower runs first
    std::optional<bool> truncate;         // false: a text over the model's maximum is TOO_MANY_TOKENS
    std::optional<Milliseconds> timeout;  // this call's wait per attempt, instead of ClientOptions::timeout
    std::optional<int> retries;           // this call's retries, instead of ClientOptions::retries
};

struct EmbedResult {
    std::uint64_t request_id = 0;
    std::size_t count = 0;        // number of texts
    std::size_t dim = 0;          // embedding dimension (384 for all-MiniLM-L6-v2)
    std::vector<float> data;      // count * dim floats, row-major, host byte order
    std::vector<std::int64_t> token_counts;
    std::vector<std::int64_t> buckets;
    std::vector<bool> truncated;
    double queue_ms = 0.0, compute_ms = 0.0;
    bool degraded = false;        // served by the circuit breaker's fallback (docs/breaker.md)
    std::string trace_id, engine, device, model_sha256, edge_version;

    const float* row(std::size_t i) const { return data.data() + i * dim; }
};

struct Health {
    bool live = false;
    bool ready = false;
    std::string state;                    // booting, ready, draining, stopped
    double uptime_s = 0.0;
    std::map<std::string, double> queue;  // texts, max_texts, tokens, in_flight, ...
    std::string trace_id;
};

// One reply to a request sent with Client::send_embed: a result or an error.
struct Outcome {
    // The request it answers; empty only for an error the server could not tie to a request
    // (a frame it could not read, or one over its frame limit) while several were in flight.
    std::optional<std::uint64_t> request_id;
    std::optional<EmbedResult> result;
    std::optional<Error> error;
    bool ok() const noexcept { return result.has_value(); }
};

namespace detail {

inline const msgpack::object* find(const msgpack::object& map, const char* key) {
    if (map.type != msgpack::type::MAP) return nullptr;
    const std::size_t n = std::strlen(key);
    for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
        const msgpack::object_kv& kv = map.via.map.ptr[i];
        if (kv.key.type == msgpack::type::STR && kv.key.via.str.size == n &&
            std::memcmp(kv.key.via.str.ptr, key, n) == 0) {
            return kv.val.type == msgpack::type::NIL ? nullptr : &kv.val;  // nil counts as absent
        }
    }
    return nullptr;
}

inline std::optional<std::string> str(const msgpack::object* o) {
    if (o == nullptr || o->type != msgpack::type::STR) return std::nullopt;
    return std::string(o->via.str.ptr, o->via.str.size);
}

inline std::optional<std::int64_t> integer(const msgpack::object* o) {
    if (o == nullptr) return std::nullopt;
    if (o->type == msgpack::type::POSITIVE_INTEGER && o->via.u64 <= static_cast<std::uint64_t>(INT64_MAX))
        return static_cast<std::int64_t>(o->via.u64);
    if (o->type == msgpack::type::NEGATIVE_INTEGER) return o->via.i64;
    return std::nullopt;
}

inline std::optional<double> number(const msgpack::object* o) {
    if (o == nullptr) return std::nullopt;
    if (o->type == msgpack::type::FLOAT32 || o->type == msgpack::type::FLOAT64) return o->via.f64;
    if (auto i = integer(o)) return static_cast<double>(*i);
    return std::nullopt;
}

inline std::optional<bool> boolean(const msgpack::object* o) {
    if (o == nullptr || o->type != msgpack::type::BOOLEAN) return std::nullopt;
    return o->via.boolean;
}

inline std::vector<std::int64_t> integers(const msgpack::object* o) {
    std::vector<std::int64_t> out;
    if (o == nullptr || o->type != msgpack::type::ARRAY) return out;
    for (std::uint32_t i = 0; i < o->via.array.size; ++i) out.push_back(integer(&o->via.array.ptr[i]).value_or(0));
    return out;
}

inline msgpack::object_handle unpack_map(const zmq::message_t& frame, const char* what) {
    if (frame.size() > 0 && *static_cast<const char*>(frame.data()) == '{')
        throw ProtocolError(std::string("reply ") + what + " is JSON; this client sends and reads msgpack");
    msgpack::object_handle oh;
    std::size_t offset = 0;
    try {
        oh = msgpack::unpack(static_cast<const char*>(frame.data()), frame.size(), offset);
    } catch (const std::exception& exc) {
        throw ProtocolError(std::string("reply ") + what + " is not msgpack: " + exc.what());
    }
    if (offset != frame.size()) throw ProtocolError(std::string("reply ") + what + " has trailing bytes");
    if (oh.get().type != msgpack::type::MAP) throw ProtocolError(std::string("reply ") + what + " is not a map");
    return oh;
}

inline bool little_endian_host() {
    const std::uint32_t one = 1;
    unsigned char first = 0;
    std::memcpy(&first, &one, 1);
    return first == 1;
}

// A decoded reply: header type, body, and the frames after the body.
struct Reply {
    std::string type;
    msgpack::object_handle body;
    std::vector<zmq::message_t> extra;

    const msgpack::object& obj() const { return body.get(); }
    bool is_error() const { return type == "error"; }
    std::optional<std::uint64_t> request_id() const {
        auto id = integer(find(obj(), "request_id"));
        if (!id || *id < 0) return std::nullopt;
        return static_cast<std::uint64_t>(*id);
    }
};

inline Reply decode_reply(std::vector<zmq::message_t>&& frames) {
    if (frames.size() < 2) throw ProtocolError("reply has " + std::to_string(frames.size()) + " frames, expected at least 2");
    msgpack::object_handle header = unpack_map(frames[0], "header");
    auto v = integer(find(header.get(), "v"));
    auto type = str(find(header.get(), "type"));
    if (!v || *v != kProtocolVersion || !type) throw ProtocolError("unexpected reply header");
    Reply r{*type, unpack_map(frames[1], "body"), {}};
    for (std::size_t i = 2; i < frames.size(); ++i) r.extra.push_back(std::move(frames[i]));
    return r;
}

inline Error to_error(const Reply& r) {
    const msgpack::object& b = r.obj();
    int code = static_cast<int>(integer(find(b, "code")).value_or(static_cast<std::int64_t>(ErrorCode::INTERNAL)));
    std::string name = str(find(b, "name")).value_or("");
    if (name.empty()) {
        const char* known = error_name(static_cast<ErrorCode>(code));
        name = known ? known : "UNKNOWN";
    }
    return Error(code, std::move(name), str(find(b, "message")).value_or(""), str(find(b, "trace_id")).value_or(""),
                 r.request_id());
}

inline EmbedResult to_result(const Reply& r, std::uint64_t request_id) {
    const msgpack::object& b = r.obj();
    auto count = integer(find(b, "count"));
    auto dim = integer(find(b, "dim"));
    if (!count || !dim || *count < 0 || *dim < 0) throw ProtocolError("infer reply without count and dim");
    if (r.extra.size() != 1)
        throw ProtocolError("infer reply has " + std::to_string(r.extra.size()) + " embedding frames, expected 1");
    EmbedResult out;
    out.request_id = request_id;
    out.count = static_cast<std::size_t>(*count);
    out.dim = static_cast<std::size_t>(*dim);
    const zmq::message_t& frame = r.extra[0];
    if (frame.size() != out.count * out.dim * 4)
        throw ProtocolError("embeddings frame has " + std::to_string(frame.size()) + " bytes, expected " +
                            std::to_string(out.count * out.dim * 4));
    out.data.resize(out.count * out.dim);
    const auto* bytes = static_cast<const unsigned char*>(frame.data());
    if (little_endian_host()) {
        if (!out.data.empty()) std::memcpy(out.data.data(), bytes, frame.size());
    } else {  // the wire is little-endian IEEE-754 float32
        for (std::size_t i = 0; i < out.data.size(); ++i) {
            const unsigned char* p = bytes + 4 * i;
            const std::uint32_t w = std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                    std::uint32_t(p[3]) << 24;
            std::memcpy(&out.data[i], &w, 4);
        }
    }
    out.token_counts = integers(find(b, "token_counts"));
    out.buckets = integers(find(b, "buckets"));
    if (const msgpack::object* t = find(b, "truncated"); t && t->type == msgpack::type::ARRAY)
        for (std::uint32_t i = 0; i < t->via.array.size; ++i) out.truncated.push_back(boolean(&t->via.array.ptr[i]).value_or(false));
    out.queue_ms = number(find(b, "queue_ms")).value_or(0.0);
    out.compute_ms = number(find(b, "compute_ms")).value_or(0.0);
    out.degraded = boolean(find(b, "degraded")).value_or(false);
    out.trace_id = str(find(b, "trace_id")).value_or("");
    out.engine = str(find(b, "engine")).value_or("");
    out.device = str(find(b, "device")).value_or("");
    out.model_sha256 = str(find(b, "model_sha256")).value_or("");
    out.edge_version = str(find(b, "edge_version")).value_or("");
    return out;
}

inline Health to_health(const Reply& r) {
    const msgpack::object& b = r.obj();
    Health h;
    h.live = boolean(find(b, "live")).value_or(false);
    h.ready = boolean(find(b, "ready")).value_or(false);
    h.state = str(find(b, "state")).value_or("");
    h.uptime_s = number(find(b, "uptime_s")).value_or(0.0);
    h.trace_id = str(find(b, "trace_id")).value_or("");
    if (const msgpack::object* q = find(b, "queue"); q && q->type == msgpack::type::MAP) {
        for (std::uint32_t i = 0; i < q->via.map.size; ++i) {
            auto key = str(&q->via.map.ptr[i].key);
            auto value = number(&q->via.map.ptr[i].val);
            if (key && value) h.queue[*key] = *value;
        }
    }
    return h;
}

inline std::string pack_header(const char* type) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(&buf);
    pk.pack_map(2);
    pk.pack(std::string("v"));
    pk.pack(kProtocolVersion);
    pk.pack(std::string("type"));
    pk.pack(std::string(type));
    return std::string(buf.data(), buf.size());
}

inline void pack_key(msgpack::packer<msgpack::sbuffer>& pk, const char* key) {
    const std::size_t n = std::strlen(key);
    pk.pack_str(static_cast<std::uint32_t>(n));
    pk.pack_str_body(key, static_cast<std::uint32_t>(n));
}

inline std::string pack_infer(const std::vector<std::string>& texts, std::uint64_t request_id, const EmbedOptions& o) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(&buf);
    pk.pack_map(2 + (o.deadline_ms ? 1 : 0) + (o.priority ? 1 : 0) + (o.truncate ? 1 : 0));
    pack_key(pk, "texts");
    pk.pack_array(static_cast<std::uint32_t>(texts.size()));
    for (const std::string& t : texts) {  // sent as is: the server checks them (EMPTY_TEXT, TEXT_TOO_LONG, ...)
        pk.pack_str(static_cast<std::uint32_t>(t.size()));
        pk.pack_str_body(t.data(), static_cast<std::uint32_t>(t.size()));
    }
    pack_key(pk, "request_id");
    pk.pack_uint64(request_id);
    if (o.deadline_ms) {
        pack_key(pk, "deadline_ms");
        pk.pack_double(*o.deadline_ms);
    }
    if (o.priority) {
        pack_key(pk, "priority");
        pk.pack_int(*o.priority);
    }
    if (o.truncate) {
        pack_key(pk, "truncate");
        if (*o.truncate) pk.pack_true(); else pk.pack_false();
    }
    return std::string(buf.data(), buf.size());
}

}  // namespace detail

class Client {
public:
    explicit Client(std::string address, ClientOptions options = {},
                    std::shared_ptr<zmq::context_t> context = nullptr)
        : ctx_(context ? std::move(context) : std::make_shared<zmq::context_t>(1)),
          address_(std::move(address)), options_(std::move(options)) {
        open();
    }

    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;
    Client(Client&&) = default;
    Client& operator=(Client&&) = default;

    const std::string& address() const noexcept { return address_; }
    const ClientOptions& options() const noexcept { return options_; }

    // Embed 1..64 texts (UTF-8). Throws edge::Error for an error reply, edge::TimeoutError when
    // no reply came in any attempt, edge::ProtocolError for a reply it cannot read.
    EmbedResult embed(const std::vector<std::string>& texts, const EmbedOptions& opts = {}) {
        const Milliseconds timeout = opts.timeout.value_or(options_.timeout);
        const int attempts = 1 + std::max(0, opts.retries.value_or(options_.retries));
        bool resent = false;  // after a SHUTTING_DOWN, on a new connection: once
        for (int attempt = 1; attempt <= attempts; ++attempt) {
            const std::uint64_t id = send_embed(texts, opts);
            if (std::optional<detail::Reply> reply = wait_for(id, timeout)) {
                if (reply->is_error()) {
                    Error e = detail::to_error(*reply);
                    if (e.code() == ErrorCode::SHUTTING_DOWN && !resent && in_flight_.empty()) {
                        reset();
                        resent = true;
                        --attempt;  // not a timed-out attempt: the retries stay the caller's
                        continue;
                    }
                    throw e;
                }
                if (reply->type != "infer") throw ProtocolError("reply of type " + reply->type + " to an infer");
                return detail::to_result(*reply, id);
            }
            reset();  // lazy pirate: the late reply, if any, goes to the closed socket
        }
        throw TimeoutError(address_, timeout, attempts);
    }

    // embed() with a server-side deadline (deadline_ms): a request still queued when it passes
    // is answered DEADLINE_EXCEEDED and not run. How long this call waits is the client's timeout.
    EmbedResult embed(const std::vector<std::string>& texts, Milliseconds deadline) {
        EmbedOptions opts;
        opts.deadline_ms = static_cast<double>(deadline.count());
        return embed(texts, opts);
    }

    // The server's health (answered while booting and draining too). Same errors as embed().
    Health health(std::optional<Milliseconds> timeout = std::nullopt) {
        const Milliseconds t = timeout.value_or(options_.timeout);
        const int attempts = 1 + std::max(0, options_.retries);
        for (int attempt = 1; attempt <= attempts; ++attempt) {
            const std::uint64_t id = next_id_++;
            send_frames(health_header_, empty_map_, t);
            in_flight_.emplace(id, Kind::Health);
            if (std::optional<detail::Reply> reply = wait_for(id, t)) {
                if (reply->is_error()) throw detail::to_error(*reply);
                return detail::to_health(*reply);
            }
            reset();
        }
        throw TimeoutError(address_, t, attempts);
    }

    // Pipelining: send an infer and return its request_id at once; its reply comes from recv().
    // Several may be in flight (the server answers in completion order). A timeout of a
    // synchronous call, or reset(), drops every request in flight.
    std::uint64_t send_embed(const std::vector<std::string>& texts, const EmbedOptions& opts = {}) {
        const std::uint64_t id = next_id_++;
        send_frames(infer_header_, detail::pack_infer(texts, id, opts), opts.timeout.value_or(options_.timeout));
        in_flight_.emplace(id, Kind::Infer);
        return id;
    }

    // The next reply to a send_embed request. TimeoutError when none comes within `timeout`
    // (the connection is kept: call reset() to give up on the requests in flight).
    Outcome recv(std::optional<Milliseconds> timeout = std::nullopt) {
        const Milliseconds t = timeout.value_or(options_.timeout);
        if (!ready_.empty()) {
            Outcome o = std::move(ready_.front());
            ready_.pop_front();
            return o;
        }
        const auto deadline = Clock::now() + t;
        while (std::optional<detail::Reply> reply = receive_until(deadline)) {
            std::optional<Outcome> o = route(std::move(*reply), std::nullopt);
            if (o) return std::move(*o);
        }
        throw TimeoutError(address_, t, 1);
    }

    // Requests sent and not yet answered on this connection.
    std::size_t in_flight() const noexcept { return in_flight_.size(); }

    // Close the socket (dropping every request in flight and any reply on its way) and open a new one.
    void reset() {
        sock_.reset();
        in_flight_.clear();
        open();
    }

private:
    using Clock = std::chrono::steady_clock;
    enum class Kind { Infer, Health };

    void open() {
        sock_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::dealer);
        sock_->set(zmq::sockopt::linger, 0);
        if (options_.configure_socket) options_.configure_socket(*sock_);
        sock_->connect(address_);
    }

    bool poll(short events, Clock::time_point deadline) {
        for (;;) {
            auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
            if (left.count() < 0) left = Milliseconds(0);
            zmq::pollitem_t item{sock_->handle(), 0, events, 0};
            try {
                zmq::poll(&item, 1, left);
            } catch (const zmq::error_t& exc) {
                if (exc.num() == EINTR) continue;
                throw;
            }
            if (item.revents & events) return true;
            if (Clock::now() >= deadline) return false;
        }
    }

    void send_frames(const std::string& header, const std::string& body, Milliseconds timeout) {
        const auto deadline = Clock::now() + timeout;
        for (;;) {  // a DEALER queues while it connects; it refuses only at its high-water mark
            if (sock_->send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) break;
            if (!poll(ZMQ_POLLOUT, deadline)) {  // the server has not read this connection for `timeout`
                reset();
                throw TimeoutError(address_, timeout, 1);
            }
        }
        sock_->send(zmq::buffer(body), zmq::send_flags::none);  // the rest of a message is never refused
    }

    std::optional<detail::Reply> receive_until(Clock::time_point deadline) {
        if (!poll(ZMQ_POLLIN, deadline)) return std::nullopt;
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(*sock_, std::back_inserter(frames), zmq::recv_flags::dontwait))
            return receive_until(deadline);
        return detail::decode_reply(std::move(frames));
    }

    // The reply to request `id`, or nothing when `timeout` passes; replies to pipelined
    // requests that arrive meanwhile are kept for recv().
    std::optional<detail::Reply> wait_for(std::uint64_t id, Milliseconds timeout) {
        const auto deadline = Clock::now() + timeout;
        while (std::optional<detail::Reply> reply = receive_until(deadline)) {
            if (owner(*reply) == id) {
                in_flight_.erase(id);
                return reply;
            }
            if (std::optional<Outcome> o = route(std::move(*reply), id)) ready_.push_back(std::move(*o));
        }
        return std::nullopt;
    }

    // Which request in flight a reply answers: by request_id for infer replies and errors, by
    // type for health; an error without an id belongs to the only request in flight, if one.
    std::optional<std::uint64_t> owner(const detail::Reply& r) const {
        if (r.type == "health") {
            for (const auto& [id, kind] : in_flight_)
                if (kind == Kind::Health) return id;
            return std::nullopt;
        }
        if (std::optional<std::uint64_t> id = r.request_id()) {
            auto it = in_flight_.find(*id);
            if (it != in_flight_.end() && it->second == Kind::Infer) return *id;
            return std::nullopt;
        }
        if (r.is_error() && in_flight_.size() == 1) return in_flight_.begin()->first;
        return std::nullopt;
    }

    // The Outcome of a reply to a pipelined infer; nothing for a stale reply (dropped) or one
    // for `waiting` (the caller's).
    std::optional<Outcome> route(detail::Reply&& r, std::optional<std::uint64_t> waiting) {
        std::optional<std::uint64_t> id = owner(r);
        if (id && id == waiting) return std::nullopt;
        if (id) {
            if (in_flight_.at(*id) != Kind::Infer) return std::nullopt;
            in_flight_.erase(*id);
            Outcome o;
            o.request_id = id;
            if (r.is_error()) o.error = detail::to_error(r);
            else o.result = detail::to_result(r, *id);
            return o;
        }
        if (r.is_error() && !r.request_id() && !in_flight_.empty()) {  // several in flight: cannot tell whose
            Outcome o;
            o.error = detail::to_error(r);
            return o;
        }
        return std::nullopt;  // stale: a request no longer in flight (reset, or answered)
    }

    std::shared_ptr<zmq::context_t> ctx_;  // declared first: destroyed after the socket
    std::string address_;
    ClientOptions options_;
    std::unique_ptr<zmq::socket_t> sock_;
    std::uint64_t next_id_ = 1;
    std::map<std::uint64_t, Kind> in_flight_;
    std::deque<Outcome> ready_;
    std::string infer_header_ = detail::pack_header("infer");
    std::string health_header_ = detail::pack_header("health");
    std::string empty_map_ = std::string(1, '\x80');
};

}  // namespace edge
