// edge-embed-cpp: embed texts with the edge runtime from C++ (clients/cpp/include/edge/client.hpp).
//
//   edge-embed-cpp [OPTIONS] TEXT...      texts from the arguments
//   edge-embed-cpp [OPTIONS] < FILE       one text per line of stdin when no TEXT is given
//   edge-embed-cpp --health               the server's health
//
// Prints one JSON line per text, {"index": I, "dim": D, "tokens": N, "embedding": [...]}, each
// float with 9 significant digits (a float32 read back is the same float). An error reply is
// printed as {"error": {"code": C, "name": ..., "message": ..., "trace_id": ...}} and the exit
// status is the code's class: 1 (1xxx, invalid request), 2 (2xxx, not served now), 3 (3xxx,
// server failure), 4 (4xxx). No reply in time: {"timeout": {...}}, exit 5. A reply it cannot
// read: {"protocol_error": ...}, exit 6. Usage: exit 64.
//
// Options:
//   --connect ADDR      the server (default $EDGE_ADDRESS, else ipc://$XDG_RUNTIME_DIR/edge/edge.sock,
//                       else ipc:///run/edge/edge.sock)
//   --timeout-ms MS     wait per attempt (default 5000)
//   --retries N         attempts after a timeout, each on a new socket (default 0)
//   --deadline-ms MS    the server-side deadline of the request
//   --priority P        0, 1 or 2
//   --no-truncate       a text over the model's maximum is an error (TOO_MANY_TOKENS)
//   --repeat N          send the request N times at once on one connection (pipelined) and print
//                       one line per reply: {"request_id": ID, "ok": true, "count": N} or
//                       {"request_id": ID, "error": {...}}; exit status: the first error's class
//   --until-ok SECONDS  after a timeout (or NOT_READY), try again with the same client until one
//                       call succeeds or SECONDS have passed; each timed-out call prints
//                       {"timeout": {...}}, each NOT_READY its {"error": {...}}
#include <edge/client.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int kExitTimeout = 5;
constexpr int kExitProtocol = 6;
constexpr int kExitUsage = 64;

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);  // UTF-8 passes through
                }
        }
    }
    return out + "\"";
}

std::string error_json(const edge::Error& e) {
    std::string out = "{\"code\": " + std::to_string(e.code_value()) + ", \"name\": " + json_string(e.name()) +
                      ", \"message\": " + json_string(e.message()) + ", \"trace_id\": " + json_string(e.trace_id());
    if (e.request_id()) out += ", \"request_id\": " + std::to_string(*e.request_id());
    return out + "}";
}

int exit_status(const edge::Error& e) {
    const int cls = static_cast<int>(e.error_class());
    return cls == 0 ? 3 : cls;
}

void print_embeddings(const edge::EmbedResult& r) {
    std::string line;
    char num[32];
    for (std::size_t i = 0; i < r.count; ++i) {
        line = "{\"index\": " + std::to_string(i) + ", \"dim\": " + std::to_string(r.dim);
        if (i < r.token_counts.size()) line += ", \"tokens\": " + std::to_string(r.token_counts[i]);
        line += ", \"embedding\": [";
        const float* row = r.row(i);
        for (std::size_t j = 0; j < r.dim; ++j) {
            std::snprintf(num, sizeof num, j ? ", %.9g" : "%.9g", static_cast<double>(row[j]));
            line += num;
        }
        line += "]}\n";
        std::fputs(line.c_str(), stdout);
    }
}

void print_health(const edge::Health& h) {
    std::string line = std::string("{\"live\": ") + (h.live ? "true" : "false") + ", \"ready\": " +
                       (h.ready ? "true" : "false") + ", \"state\": " + json_string(h.state) +
                       ", \"trace_id\": " + json_string(h.trace_id) + ", \"queue\": {";
    bool first = true;
    char num[32];
    for (const auto& [key, value] : h.queue) {
        std::snprintf(num, sizeof num, "%.17g", value);
        line += (first ? "" : ", ") + json_string(key) + ": " + num;
        first = false;
    }
    std::fputs((line + "}}\n").c_str(), stdout);
}

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr, "edge-embed-cpp: %s\nusage: edge-embed-cpp [--connect ADDR] [--timeout-ms MS] [--retries N] "
                 "[--deadline-ms MS] [--priority P] [--no-truncate] [--repeat N] [--until-ok SECONDS] "
                 "[--health | TEXT...]\n", why.c_str());
    std::exit(kExitUsage);
}

long number_arg(int argc, char** argv, int& i, long lo, long hi) {
    const std::string flag = argv[i];
    if (++i >= argc) usage(flag + " needs a value");
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v < lo || v > hi) usage(flag + ": not a number in " + std::to_string(lo) + ".." + std::to_string(hi));
    return v;
}

std::string default_address() {
    if (const char* a = std::getenv("EDGE_ADDRESS"); a && *a) return a;
    if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string("ipc://") + x + "/edge/edge.sock";
    return "ipc:///run/edge/edge.sock";
}

}  // namespace

int main(int argc, char** argv) {
    std::string address = default_address();
    edge::ClientOptions options;
    edge::EmbedOptions embed_options;
    bool health = false;
    long repeat = 0;
    long until_ok_s = 0;
    std::vector<std::string> texts;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--connect") {
            if (++i >= argc) usage("--connect needs a value");
            address = argv[i];
        } else if (a == "--timeout-ms") {
            options.timeout = edge::Milliseconds(number_arg(argc, argv, i, 1, 86400000));
        } else if (a == "--retries") {
            options.retries = static_cast<int>(number_arg(argc, argv, i, 0, 1000));
        } else if (a == "--deadline-ms") {
            embed_options.deadline_ms = static_cast<double>(number_arg(argc, argv, i, 0, 86400000));
        } else if (a == "--priority") {
            embed_options.priority = static_cast<int>(number_arg(argc, argv, i, -1000, 1000));
        } else if (a == "--no-truncate") {
            embed_options.truncate = false;
        } else if (a == "--repeat") {
            repeat = number_arg(argc, argv, i, 1, 100000);
        } else if (a == "--until-ok") {
            until_ok_s = number_arg(argc, argv, i, 1, 86400);
        } else if (a == "--health") {
            health = true;
        } else if (a == "--help" || a == "-h") {
            usage("embed texts with the edge runtime");
        } else if (a == "--") {
            texts.insert(texts.end(), argv + i + 1, argv + argc);
            break;
        } else if (a.size() > 1 && a[0] == '-' && a[1] == '-') {
            usage("unknown option " + a);
        } else {
            texts.push_back(a);
        }
    }
    if (!health && texts.empty()) {
        for (std::string line; std::getline(std::cin, line);) texts.push_back(line);
        if (texts.empty()) usage("no texts (give them as arguments or on stdin, one per line)");
    }

    const auto start = std::chrono::steady_clock::now();
    try {
        edge::Client client(address, options);
        if (repeat > 0 && !health) {  // pipelined: every request in flight at once
            for (long n = 0; n < repeat; ++n) client.send_embed(texts, embed_options);
            int status = 0;
            for (long n = 0; n < repeat; ++n) {
                edge::Outcome o = client.recv();
                const std::string id = o.request_id ? std::to_string(*o.request_id) : "null";
                if (o.ok()) {
                    std::printf("{\"request_id\": %s, \"ok\": true, \"count\": %zu}\n", id.c_str(), o.result->count);
                } else {
                    std::printf("{\"request_id\": %s, \"error\": %s}\n", id.c_str(), error_json(*o.error).c_str());
                    if (status == 0) status = exit_status(*o.error);
                }
            }
            return status;
        }
        for (;;) {
            try {
                if (health) print_health(client.health());
                else print_embeddings(client.embed(texts, embed_options));
                return 0;
            } catch (const edge::TimeoutError& e) {
                const auto elapsed = std::chrono::duration_cast<edge::Milliseconds>(std::chrono::steady_clock::now() - start);
                std::printf("{\"timeout\": {\"message\": %s, \"attempts\": %d, \"timeout_ms\": %lld, \"elapsed_ms\": %lld}}\n",
                            json_string(e.what()).c_str(), e.attempts(), static_cast<long long>(e.timeout().count()),
                            static_cast<long long>(elapsed.count()));
                std::fflush(stdout);
                if (elapsed >= std::chrono::seconds(until_ok_s)) return kExitTimeout;
            } catch (const edge::Error& e) {  // a server still booting answers NOT_READY
                const auto elapsed = std::chrono::steady_clock::now() - start;
                if (e.code() != edge::ErrorCode::NOT_READY || elapsed >= std::chrono::seconds(until_ok_s)) throw;
                std::printf("{\"error\": %s}\n", error_json(e).c_str());
                std::fflush(stdout);
            }
        }
    } catch (const edge::Error& e) {
        std::printf("{\"error\": %s}\n", error_json(e).c_str());
        return exit_status(e);
    } catch (const edge::TimeoutError& e) {  // a recv() of --repeat
        std::printf("{\"timeout\": {\"message\": %s}}\n", json_string(e.what()).c_str());
        return kExitTimeout;
    } catch (const edge::ProtocolError& e) {
        std::printf("{\"protocol_error\": %s}\n", json_string(e.what()).c_str());
        return kExitProtocol;
    } catch (const zmq::error_t& e) {  // e.g. an address ZeroMQ refuses
        std::printf("{\"protocol_error\": %s}\n", json_string(std::string("zmq: ") + e.what()).c_str());
        return kExitProtocol;
    }
}
