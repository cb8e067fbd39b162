// The client connection behind a request, so a generation can stop at the next token when its
// client goes away. The HTTP front's worker answers each request on one thread and marks it with a
// connection_scope for that time; a handler (and its content provider, which runs inside the same
// answer) asks for the socket here. The descriptor stays open until the answer is written.
#pragma once

namespace strata::server {

// Marks the calling thread as answering a request that arrived on `fd`, until destroyed. http10: the
// request is HTTP/1.0 (no informational answers may be sent to it).
class connection_scope {
public:
    explicit connection_scope(int fd, bool http10 = false);
    ~connection_scope();
    connection_scope(const connection_scope&) = delete;
    connection_scope& operator=(const connection_scope&) = delete;

    // Set by close_after_answer(): the connection must not be kept alive after this answer.
    bool close_requested() const { return close_; }

private:
    friend void close_after_answer();
    friend int current_connection_socket(int);
    int fd_;
    int remote_port_ = -1;
    bool close_ = false;
    connection_scope* outer_;
};

// The socket of the connection the calling thread is answering, when its peer port is `remote_port`
// (the request's, as a check that the request is the one being answered); -1 otherwise.
int current_connection_socket(int remote_port);

// The answer on the calling thread's connection ends when the connection closes (a body without
// length or chunks): the connection is closed after it.
void close_after_answer();

// Called before the first byte of the answer on `fd` is written.
void answer_starts(int fd);

// True once the client can no longer read the answer: the connection was reset, or the client closed
// it whole. A client that only shut down its sending side (half-close) still gets its answer: when
// the end of its request stream is seen before any answer was written, an informational
// "100 Continue" is sent, which such a client skips and a closed socket answers with a reset, seen
// at the next call. On HTTP/1.0, which has no informational answers, only a failed write tells.
// Never blocks.
bool peer_closed(int fd);

}  // namespace strata::server
