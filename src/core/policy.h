// Process-wide and thread-local policy: retain default, thread count.
#pragma once

namespace qpack {

// Retain resolution: per-object request > thread-local override > process default.
bool resolve_retain(int request);
bool default_retain();
void set_default_retain(bool keep);
int thread_retain();          // QPACK_RETAIN_DEFAULT when no override
int set_thread_retain(int r);  // returns previous

// Threads per op: qpack_set_num_threads' value, or 1 in a process forked
// after start (see in_forked_child).
int num_threads();
bool in_forked_child();
void set_num_threads(int n);

}  // namespace qpack
