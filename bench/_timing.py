"""Shared timing helpers for the benchmarks (medians, side by side in one run),
and the thread-count check: CPU time of every thread of this process over a
timed block, so each row can say how many threads actually worked."""
import os
import statistics
import time

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def median_us(fn, *, min_time=0.3, min_iters=10, max_iters=2000, warmup=3):
    """Median wall time of fn() in microseconds."""
    return timed(fn, min_time=min_time, min_runs=min_iters, max_runs=max_iters, warmup=warmup).median_ms * 1e3


def _task_cpu_s(tid):
    """CPU time (s) of one thread of this process. The threads are those listed in
    /proc/self/task; each one's time comes from its Linux per-thread CPU clock
    (clock_gettime on MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), exact to the
    nanosecond even for a thread running now), else from
    /proc/self/task/<tid>/schedstat, else from utime+stime of .../stat. The last two
    are only brought up to date at scheduler ticks for a running thread (4-10 ms),
    too coarse for blocks of a few milliseconds."""
    try:
        return time.clock_gettime(((~tid) << 3) | 6)
    except (OSError, OverflowError, ValueError):
        pass
    base = f"/proc/self/task/{tid}"
    try:
        with open(base + "/schedstat") as f:
            return int(f.read().split()[0]) * 1e-9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(base + "/stat") as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()   # fields from 3 (state) on: utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def thread_cpu():
    """{tid: CPU seconds} for every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        t = _task_cpu_s(int(tid))
        if t is not None:
            out[int(tid)] = t
    return out


class Timed:
    """Result of `timed`: median ms, threads that worked, CPU seconds per wall second."""

    def __init__(self, median_ms, runs, wall_s, per_thread_cpu_s, threshold=0.05):
        self.median_ms = median_ms
        self.runs = runs
        self.wall_s = wall_s
        self.per_thread = sorted(per_thread_cpu_s, reverse=True)
        self.threads_used = sum(1 for c in self.per_thread if c > threshold * wall_s)
        self.cpu_per_wall = sum(self.per_thread) / wall_s if wall_s > 0 else float("nan")


def timed(fn, *, min_time=1.0, min_runs=10, max_runs=500, warmup=3, threshold=0.05):
    """Times fn() `min_runs` times at least and for `min_time` seconds at least
    (at most `max_runs`), after `warmup` calls; counts the threads of this process
    whose CPU time grew by more than `threshold` of the block's wall time."""
    for _ in range(warmup):
        fn()
    before = thread_cpu()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < min_time and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    after = thread_cpu()
    deltas = [c - before.get(tid, 0.0) for tid, c in after.items()]
    return Timed(statistics.median(times) * 1e3, len(times), wall, deltas, threshold)


def timed_side_by_side(fns, *, rounds=5, min_time=1.0, min_runs=10, max_runs=500, warmup=3, threshold=0.05,
                       settle=0.2):
    """`timed` for several fns in alternating rounds: each round runs every fn for
    min_time / rounds seconds (at least min_runs / rounds times), so a machine that
    gets busier or quieter during the run moves every fn alike and the ratios
    between them stay valid. One Timed per fn, over all its rounds (threads counted
    from their CPU time summed over the rounds). Before each block the process
    idles `settle` seconds, so that the thread pools of the fn before (OpenMP's and
    ONNX Runtime's spin before they sleep) neither take the cores nor count as
    threads of this one."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    per_min = -(-min_runs // rounds)
    per_max = max(per_min, -(-max_runs // rounds))
    times = [[] for _ in fns]
    walls = [0.0] * len(fns)
    cpus = [{} for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            time.sleep(settle)
            fn()  # one untimed call: the pool wakes up
            before = thread_cpu()
            start = time.perf_counter()
            n = 0
            while n < per_min or (time.perf_counter() - start < min_time / rounds and n < per_max):
                t0 = time.perf_counter()
                fn()
                times[i].append(time.perf_counter() - t0)
                n += 1
            walls[i] += time.perf_counter() - start
            for tid, c in thread_cpu().items():
                cpus[i][tid] = cpus[i].get(tid, 0.0) + c - before.get(tid, 0.0)
    return [Timed(statistics.median(t) * 1e3, len(t), w, list(c.values()), threshold)
            for t, w, c in zip(times, walls, cpus)]


def fmt_table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, sep] + body)
