/*
 * fiber.cpp — runs a CUDA grid on the CPU: every thread of a block is a
 * fiber (ucontext), the block's threads take turns, each running until it
 * waits (at a barrier or a warp collective) or returns, and the blocks of
 * the grid run one after another.  See cudacpu.h for what this checks.
 *
 * Sanitizers.  Under AddressSanitizer each switch tells ASan which stack it
 * moves to (__sanitizer_start/finish_switch_fiber).  Under
 * ThreadSanitizer (built with CUDACPU_TSAN=1; this file itself is left
 * uninstrumented, its bookkeeping is not the kernel's) every fiber has its
 * own TSan context, switches create no happens-before, and the only
 * orderings TSan sees are CUDA's: a barrier orders everything before it in
 * the block before everything after it, a warp collective does the same
 * for its warp, and consecutive blocks are ordered (their __shared__
 * variables are the same memory here, not on a GPU), so TSan reports the
 * races between the threads of one block.
 */
#include "cudacpu.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDACPU_ASAN 1
#endif
#if defined(CUDACPU_TSAN) && CUDACPU_TSAN
#include <sanitizer/tsan_interface.h>
#else
#undef CUDACPU_TSAN
#endif

namespace cudacpu {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;

enum class State { Ready, AtBarrier, AtWarp, Done };

enum class Order { Forward, Reverse, Random };

/* A fiber stack with a guard page below it, kept for the process. */
struct Stack {
    char *base = nullptr; /* lowest usable byte */
    size_t size = 0;
#ifdef CUDACPU_TSAN
    void *tsan_fiber = nullptr;
#endif
};

struct Thread {
    ucontext_t ctx;
    Stack *stack = nullptr;
    uint3 idx;
    int linear = 0;
    State state = State::Ready;
    Site site = {nullptr, 0};
    /* a barrier */
    int bar_op = 0, bar_pred = 0, bar_result = 0;
    /* a warp collective */
    WarpOp warp_op = WARP_SYNC;
    unsigned warp_mask = 0, warp_result = 0;
    int lane_arg = 0, width = 0, predicate = 0;
    size_t size = 0;
    unsigned char value[16], out[16];
};

/* The launch being run (one at a time: see launch_mutex). */
struct Grid {
    const char *kernel;
    dim3 grid, block;
    void (*body)(void *);
    void *closure;
    uint3 block_idx;
    int nthreads;
    std::vector<Thread> threads;
    Thread *current = nullptr; /* the thread whose fiber runs, else null */
    ucontext_t scheduler;
    bool failed = false;
    std::string error;
#ifdef CUDACPU_ASAN
    const void *scheduler_stack = nullptr;
    size_t scheduler_stack_size = 0;
#endif
#ifdef CUDACPU_TSAN
    void *scheduler_fiber = nullptr;
    /* addresses TSan synchronizes on */
    char block_start, block_end, barrier;
    char warps[kMaxThreadsPerBlock / kWarp];
#endif
};

std::mutex launch_mutex;
Grid *running = nullptr;         /* under launch_mutex */
thread_local bool in_launch = false;
std::vector<Stack> stacks;       /* under launch_mutex */
struct GridLimit {
    std::string kernel;
    dim3 max;
};
std::vector<GridLimit> grid_limits;             /* under launch_mutex */
std::map<std::string, unsigned long long> launches_by_kernel; /* under launch_mutex */
unsigned long long rng_state = 0;               /* under launch_mutex */
std::string rng_seeded_for;                     /* the schedule string it was seeded for */

/* ------------------------------------------------------------ helpers */

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

const char *basename_of(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : nullptr;
    return slash ? slash + 1 : path ? path : "?";
}

std::string where(const Site &s)
{
    return format("%s:%d", basename_of(s.file), s.line);
}

std::string thread_name(const Grid &g, const Thread &t)
{
    if (g.block.y == 1 && g.block.z == 1)
        return format("thread %u", t.idx.x);
    return format("thread (%u,%u,%u)", t.idx.x, t.idx.y, t.idx.z);
}

/* The kernel's name without template arguments or spaces. */
std::string base_name(const char *kernel)
{
    std::string s(kernel);
    size_t lt = s.find('<');
    if (lt != std::string::npos)
        s.resize(lt);
    while (!s.empty() && s.back() == ' ')
        s.pop_back();
    return s;
}

unsigned long long next_random()
{
    /* splitmix64: a seeded sequence, the same on every run */
    unsigned long long z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void order_indices(std::vector<int> &order, Order how)
{
    for (size_t i = 0; i < order.size(); i++)
        order[i] = how == Order::Reverse ? (int)(order.size() - 1 - i) : (int)i;
    if (how == Order::Random)
        for (size_t i = order.size(); i > 1; i--)
            std::swap(order[i - 1], order[next_random() % i]);
}

/* GPUACCEL_CUDACPU_SCHEDULE: forward (default), reverse, random[:seed]. */
bool read_schedule(Order *how)
{
    const char *env = getenv("GPUACCEL_CUDACPU_SCHEDULE");
    std::string s = env ? env : "";
    if (s.empty() || s == "forward") {
        *how = Order::Forward;
        return true;
    }
    if (s == "reverse") {
        *how = Order::Reverse;
        return true;
    }
    if (s.compare(0, 6, "random") == 0 && (s.size() == 6 || s[6] == ':')) {
        unsigned long long seed = 1;
        if (s.size() > 6) {
            char *end = nullptr;
            errno = 0;
            seed = strtoull(s.c_str() + 7, &end, 10);
            if (errno || !end || *end || end == s.c_str() + 7)
                return false;
        }
        if (rng_seeded_for != s) { /* a new seed starts its sequence again */
            rng_seeded_for = s;
            rng_state = seed;
        }
        *how = Order::Random;
        return true;
    }
    return false;
}

size_t stack_bytes()
{
    const char *env = getenv("GPUACCEL_CUDACPU_STACK_KIB");
    long kib = env && *env ? atol(env) : 256;
    if (kib < 64)
        kib = 64;
    long page = sysconf(_SC_PAGESIZE);
    return ((size_t)kib * 1024 + (size_t)page - 1) / (size_t)page * (size_t)page;
}

bool ensure_stacks(size_t n)
{
    size_t size = stack_bytes();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    while (stacks.size() < n) {
        void *p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return false;
        mprotect(p, page, PROT_NONE); /* an overflow faults instead of corrupting */
        Stack s;
        s.base = (char *)p + page;
        s.size = size;
#ifdef CUDACPU_TSAN
        s.tsan_fiber = __tsan_create_fiber(0);
#endif
        stacks.push_back(s);
    }
    return true;
}

/* ------------------------------------------------------------ switching */

#ifdef CUDACPU_ASAN
/* libc's own swapcontext, not ASan's interceptor of it: the interceptor
 * clears the shadow of the whole target stack on every switch (which
 * would hide an overflow of a suspended thread's locals, and is slow);
 * the switches are announced with __sanitizer_start_switch_fiber instead. */
int swap_context(ucontext_t *from, const ucontext_t *to)
{
    using Swap = int (*)(ucontext_t *, const ucontext_t *);
    static Swap libc_swap = [] {
        void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
        void *sym = libc ? dlsym(libc, "swapcontext") : nullptr;
        return sym ? (Swap)sym : &swapcontext;
    }();
    return libc_swap(from, to);
}
#else
int swap_context(ucontext_t *from, const ucontext_t *to) { return swapcontext(from, to); }
#endif

void switch_to_thread(Grid &g, Thread *t)
{
    g.current = t;
#ifdef CUDACPU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, t->stack->base, t->stack->size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(t->stack->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    swap_context(&g.scheduler, &t->ctx);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    g.current = nullptr;
}

/* From a fiber back to the scheduler; `leaving`: it will not be resumed. */
void switch_to_scheduler(Grid &g, Thread *t, bool leaving)
{
#ifdef CUDACPU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(leaving ? nullptr : &fake, g.scheduler_stack,
                                   g.scheduler_stack_size);
#else
    (void)leaving;
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(g.scheduler_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    swap_context(&t->ctx, &g.scheduler);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_main()
{
    Grid &g = *running;
    Thread *t = g.current;
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g.scheduler_stack, &g.scheduler_stack_size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_acquire(&g.block_start);
#endif
    g.body(g.closure);
    t->state = State::Done;
#ifdef CUDACPU_TSAN
    __tsan_release(&g.block_end);
#endif
    switch_to_scheduler(g, t, true);
}

/* Stops the launch from inside a fiber: the block is abandoned. */
void fail_in_fiber(Grid &g, Thread *t, std::string message)
{
    g.failed = true;
    g.error = std::move(message);
    switch_to_scheduler(g, t, false); /* never resumed */
}

Thread *running_thread()
{
    Grid *g = running;
    return g && g->current ? g->current : nullptr;
}

/* ------------------------------------------------------- warp collectives */

const char *op_name(WarpOp op)
{
    switch (op) {
    case WARP_SYNC: return "__syncwarp";
    case WARP_SHFL_IDX: return "__shfl_sync";
    case WARP_SHFL_UP: return "__shfl_up_sync";
    case WARP_SHFL_DOWN: return "__shfl_down_sync";
    case WARP_SHFL_XOR: return "__shfl_xor_sync";
    case WARP_ALL: return "__all_sync";
    case WARP_ANY: return "__any_sync";
    case WARP_BALLOT: return "__ballot_sync";
    }
    return "?";
}

bool is_shuffle(WarpOp op)
{
    return op == WARP_SHFL_IDX || op == WARP_SHFL_UP || op == WARP_SHFL_DOWN ||
           op == WARP_SHFL_XOR;
}

std::string describe_collective(const Grid &g, const Thread &t)
{
    return format("%s at %s: %s(mask 0x%08x)", thread_name(g, t).c_str(), where(t.site).c_str(),
                  op_name(t.warp_op), t.warp_mask);
}

/* Lanes [0, lanes_in(warp)) of a warp exist in the block. */
int lanes_in(const Grid &g, int warp_base)
{
    return std::min(kWarp, g.nthreads - warp_base);
}

enum class Progress { Waiting, Completed, Failed };

/* Completes the collective that lanes of the warp at `warp_base` wait at,
 * when every lane its mask names has arrived at one of the same kind with
 * the same mask (lanes that have exited take no part, as on a GPU).
 * `first` is one lane that waits there.  A named lane that waits at
 * another collective may still finish that one and come here: while it
 * waits, *why says so, for the report should nothing else move. */
Progress try_complete(Grid &g, int warp_base, const Thread &first, std::string *why)
{
    unsigned mask = first.warp_mask, arrived = 0;
    bool waiting = false;
    for (int lane = 0; lane < kWarp; lane++) {
        if (!(mask >> lane & 1))
            continue;
        const Thread &o = g.threads[(size_t)(warp_base + lane)];
        switch (o.state) {
        case State::Done:
            continue;
        case State::Ready:
            waiting = true;
            break;
        case State::AtBarrier:
            *why = format("deadlock: %s waits at __syncthreads at %s, and %s waits for it",
                          thread_name(g, o).c_str(), where(o.site).c_str(),
                          describe_collective(g, first).c_str());
            return Progress::Failed;
        case State::AtWarp:
            if (o.warp_op != first.warp_op || o.warp_mask != mask ||
                (is_shuffle(o.warp_op) && o.width != first.width)) {
                *why = format("warp collectives disagree: %s, but %s",
                              describe_collective(g, first).c_str(),
                              describe_collective(g, o).c_str());
                waiting = true;
                break;
            }
            arrived |= 1u << lane;
            break;
        }
    }
    if (waiting)
        return Progress::Waiting;
    unsigned ballot = 0;
    for (int lane = 0; lane < kWarp; lane++)
        if (arrived >> lane & 1 && g.threads[(size_t)(warp_base + lane)].predicate)
            ballot |= 1u << lane;
    for (int lane = 0; lane < kWarp; lane++) {
        if (!(arrived >> lane & 1))
            continue;
        Thread &t = g.threads[(size_t)(warp_base + lane)];
        switch (t.warp_op) {
        case WARP_SYNC: break;
        case WARP_ALL: t.warp_result = ballot == arrived; break;
        case WARP_ANY: t.warp_result = ballot != 0; break;
        case WARP_BALLOT: t.warp_result = ballot; break;
        default: {
            int seg = lane & ~(t.width - 1), src = lane;
            if (t.warp_op == WARP_SHFL_IDX)
                src = seg + (t.lane_arg & (t.width - 1));
            else if (t.warp_op == WARP_SHFL_UP)
                src = lane - t.lane_arg >= seg ? lane - t.lane_arg : lane;
            else if (t.warp_op == WARP_SHFL_DOWN)
                src = lane + t.lane_arg < seg + t.width ? lane + t.lane_arg : lane;
            else
                src = (lane ^ t.lane_arg) >= seg && (lane ^ t.lane_arg) < seg + t.width
                          ? lane ^ t.lane_arg
                          : lane;
            if (!(arrived >> src & 1)) {
                *why = format("%s reads lane %d, which %s", describe_collective(g, t).c_str(),
                              src,
                              mask >> src & 1 ? "has exited" : "its mask does not name");
                return Progress::Failed;
            }
            memcpy(t.out, g.threads[(size_t)(warp_base + src)].value, t.size);
            break;
        }
        }
    }
    for (int lane = 0; lane < kWarp; lane++)
        if (arrived >> lane & 1)
            g.threads[(size_t)(warp_base + lane)].state = State::Ready;
    return Progress::Completed;
}

/* ------------------------------------------------------------ a block */

/* When no thread can run: completes warp collectives whose other lanes
 * have exited, or releases the block from its barrier.  False with
 * g.error set when neither can happen: the block cannot go on. */
bool unblock(Grid &g, std::vector<int> &order, Order how)
{
    std::string disagreement;
    for (int i = 0; i < g.nthreads; i++) {
        Thread &t = g.threads[(size_t)i];
        if (t.state != State::AtWarp)
            continue;
        std::string why;
        Progress p = try_complete(g, i - i % kWarp, t, &why);
        if (p == Progress::Completed)
            return true;
        if (p == Progress::Failed) {
            g.error = why;
            return false;
        }
        if (disagreement.empty())
            disagreement = why;
    }
    const Thread *waiting = nullptr, *exited = nullptr, *at_warp = nullptr;
    for (const Thread &t : g.threads) {
        if (t.state == State::AtBarrier && !waiting)
            waiting = &t;
        else if (t.state == State::Done && !exited)
            exited = &t;
        else if (t.state == State::AtWarp && !at_warp)
            at_warp = &t;
    }
    if (at_warp && !disagreement.empty()) {
        g.error = disagreement;
        return false;
    }
    if (at_warp) {
        g.error = format("deadlock: %s waits for lanes that never arrive%s",
                         describe_collective(g, *at_warp).c_str(),
                         waiting ? " (they wait at __syncthreads)" : "");
        return false;
    }
    if (exited) {
        g.error = format("divergent barrier: %s waits at __syncthreads at %s, but %s has "
                         "returned without reaching it",
                         thread_name(g, *waiting).c_str(), where(waiting->site).c_str(),
                         thread_name(g, *exited).c_str());
        return false;
    }
    for (const Thread &t : g.threads)
        if (t.site.line != waiting->site.line || strcmp(t.site.file, waiting->site.file) != 0 ||
            t.bar_op != waiting->bar_op) {
            g.error = format("divergent barrier: %s waits at __syncthreads at %s, %s at %s",
                             thread_name(g, *waiting).c_str(), where(waiting->site).c_str(),
                             thread_name(g, t).c_str(), where(t.site).c_str());
            return false;
        }
    int count = 0;
    for (const Thread &t : g.threads)
        count += t.bar_pred != 0;
    int result = waiting->bar_op == 1   ? count
                 : waiting->bar_op == 2 ? count == g.nthreads
                 : waiting->bar_op == 3 ? count > 0
                                        : 0;
    for (Thread &t : g.threads) {
        t.bar_result = result;
        t.state = State::Ready;
    }
    if (how == Order::Random)
        order_indices(order, how);
    return true;
}

/* Abandons the fibers of a failed block. */
void abandon(Grid &g)
{
#ifdef CUDACPU_ASAN
    for (Thread &t : g.threads)
        if (t.state != State::Done)
            __asan_unpoison_memory_region(t.stack->base, t.stack->size);
#else
    (void)g;
#endif
}

bool run_block(Grid &g, Order how)
{
    for (int i = 0; i < g.nthreads; i++) {
        Thread &t = g.threads[(size_t)i];
        t.stack = &stacks[(size_t)i];
        t.linear = i;
        t.idx.x = (unsigned)i % g.block.x;
        t.idx.y = (unsigned)i / g.block.x % g.block.y;
        t.idx.z = (unsigned)i / (g.block.x * g.block.y);
        t.state = State::Ready;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack->base;
        t.ctx.uc_stack.ss_size = t.stack->size;
        t.ctx.uc_link = nullptr;
        makecontext(&t.ctx, fiber_main, 0);
    }
#ifdef CUDACPU_TSAN
    __tsan_release(&g.block_start);
#endif
    std::vector<int> order((size_t)g.nthreads);
    order_indices(order, how);
    for (;;) {
        bool ran = false;
        for (int i : order) {
            Thread &t = g.threads[(size_t)i];
            if (t.state != State::Ready)
                continue;
            switch_to_thread(g, &t);
            ran = true;
            if (g.failed) {
                abandon(g);
                return false;
            }
        }
        if (how == Order::Random)
            order_indices(order, how);
        if (ran)
            continue;
        bool all_done = true;
        for (const Thread &t : g.threads)
            all_done = all_done && t.state == State::Done;
        if (all_done)
            break;
        if (!unblock(g, order, how)) {
            g.failed = true;
            abandon(g);
            return false;
        }
    }
#ifdef CUDACPU_TSAN
    __tsan_acquire(&g.block_end);
#endif
    return true;
}

bool valid_config(dim3 grid, dim3 block, std::string *why)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || threads > kMaxThreadsPerBlock || block.z > 64) {
        *why = format("block (%u,%u,%u): a block has 1 to 1024 threads, z at most 64", block.x,
                      block.y, block.z);
        return false;
    }
    if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535) {
        *why = format("grid (%u,%u,%u): x in [1, 2^31-1], y and z in [1, 65535]", grid.x,
                      grid.y, grid.z);
        return false;
    }
    return true;
}

void apply_grid_limit(const std::string &name, dim3 *grid)
{
    for (const GridLimit &l : grid_limits)
        if (l.kernel == name) {
            grid->x = std::min(grid->x, l.max.x);
            grid->y = std::min(grid->y, l.max.y);
            grid->z = std::min(grid->z, l.max.z);
        }
}

} // namespace

/* ------------------------------------------------------------- the API */

uint3 thread_idx()
{
    Thread *t = running_thread();
    return t ? t->idx : uint3{0, 0, 0};
}

uint3 block_idx()
{
    Grid *g = running;
    return g ? g->block_idx : uint3{0, 0, 0};
}

dim3 block_dim()
{
    Grid *g = running;
    return g ? g->block : dim3(1, 1, 1);
}

dim3 grid_dim()
{
    Grid *g = running;
    return g ? g->grid : dim3(1, 1, 1);
}

int sync_threads(Site site, int op, int predicate)
{
    Thread *t = running_thread();
    if (!t)
        return predicate; /* host code: a block of one */
    Grid &g = *running;
    t->state = State::AtBarrier;
    t->site = site;
    t->bar_op = op;
    t->bar_pred = predicate;
#ifdef CUDACPU_TSAN
    __tsan_release(&g.barrier);
#endif
    switch_to_scheduler(g, t, false);
#ifdef CUDACPU_TSAN
    __tsan_acquire(&g.barrier);
#endif
    return t->bar_result;
}

unsigned warp_collective(Site site, WarpOp op, unsigned mask, const void *value, void *out,
                         size_t size, int lane_arg, int width, int predicate)
{
    Thread *t = running_thread();
    if (!t) {
        if (size)
            memcpy(out, value, size);
        return op == WARP_BALLOT ? (unsigned)(predicate != 0) : (unsigned)(predicate != 0);
    }
    Grid &g = *running;
    int lane = t->linear % kWarp, warp_base = t->linear - lane;
    t->site = site;
    t->warp_op = op;
    t->warp_mask = mask;
    t->lane_arg = lane_arg;
    t->width = width;
    t->predicate = predicate;
    t->size = size;
    if (size)
        memcpy(t->value, value, size);
    t->state = State::AtWarp;
    int lanes = lanes_in(g, warp_base);
    if (!(mask >> lane & 1))
        fail_in_fiber(g, t, format("%s: the mask does not name the calling lane %d",
                                   describe_collective(g, *t).c_str(), lane));
    if (lanes < kWarp && mask >> lanes)
        fail_in_fiber(g, t, format("%s names lanes that warp %d of this block lacks (it has "
                                   "lanes 0-%d)",
                                   describe_collective(g, *t).c_str(), t->linear / kWarp,
                                   lanes - 1));
    if (is_shuffle(op) && (width < 1 || width > kWarp || (width & (width - 1))))
        fail_in_fiber(g, t, format("%s: width %d is not a power of two up to 32",
                                   describe_collective(g, *t).c_str(), width));
#ifdef CUDACPU_TSAN
    __tsan_release(&g.warps[t->linear / kWarp]);
#endif
    std::string why;
    Progress p = try_complete(g, warp_base, *t, &why);
    if (p == Progress::Failed)
        fail_in_fiber(g, t, why);
    if (p == Progress::Waiting)
        switch_to_scheduler(g, t, false);
#ifdef CUDACPU_TSAN
    __tsan_acquire(&g.warps[t->linear / kWarp]);
#endif
    if (size)
        memcpy(out, t->out, size);
    return t->warp_result;
}

unsigned active_mask()
{
    Thread *t = running_thread();
    if (!t)
        return 1;
    Grid &g = *running;
    int warp_base = t->linear - t->linear % kWarp;
    unsigned mask = 0;
    for (int lane = 0; lane < lanes_in(g, warp_base); lane++)
        if (g.threads[(size_t)(warp_base + lane)].state != State::Done)
            mask |= 1u << lane;
    return mask;
}

void limit_grid(const char *kernel, dim3 max)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (!kernel) {
        grid_limits.clear();
        return;
    }
    grid_limits.push_back(GridLimit{base_name(kernel), max});
}

void launch(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            void (*body)(void *), void *closure)
{
    (void)stream; /* launches run at once: the simulator checks stream order */
    if (in_launch) {
        set_error(cudaErrorNotSupported, "cudacpu: %s launched from inside a kernel", kernel);
        return;
    }
    std::string why;
    if (!valid_config(grid, block, &why)) {
        set_error(cudaErrorInvalidConfiguration, "cudacpu: launch of %s: %s", kernel,
                  why.c_str());
        return;
    }
    if (shared_bytes) {
        set_error(cudaErrorNotSupported,
                  "cudacpu: launch of %s asks for %zu bytes of dynamic shared memory, which "
                  "cudacpu does not support (extern __shared__)",
                  kernel, shared_bytes);
        return;
    }
    std::lock_guard<std::mutex> lock(launch_mutex);
    Order how;
    if (!read_schedule(&how)) {
        set_error(cudaErrorInvalidValue,
                  "cudacpu: GPUACCEL_CUDACPU_SCHEDULE=%s: expected forward, reverse, random or "
                  "random:<seed>",
                  getenv("GPUACCEL_CUDACPU_SCHEDULE"));
        return;
    }
    std::string name = base_name(kernel);
    launches_by_kernel[name]++;
    apply_grid_limit(name, &grid);
    Grid g;
    g.kernel = kernel;
    g.grid = grid;
    g.block = block;
    g.body = body;
    g.closure = closure;
    g.nthreads = (int)(block.x * block.y * block.z);
    g.threads.resize((size_t)g.nthreads);
    if (!ensure_stacks((size_t)g.nthreads)) {
        set_error(cudaErrorMemoryAllocation, "cudacpu: no memory for %d fiber stacks",
                  g.nthreads);
        return;
    }
#ifdef CUDACPU_TSAN
    g.scheduler_fiber = __tsan_get_current_fiber();
#endif
    unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    std::vector<unsigned long long> blocks;
    if (how == Order::Random) {
        blocks.resize(nblocks);
        for (unsigned long long b = 0; b < nblocks; b++)
            blocks[b] = b;
        for (unsigned long long i = nblocks; i > 1; i--)
            std::swap(blocks[i - 1], blocks[next_random() % i]);
    }
    running = &g;
    in_launch = true;
    for (unsigned long long k = 0; k < nblocks; k++) {
        unsigned long long b = how == Order::Forward   ? k
                               : how == Order::Reverse ? nblocks - 1 - k
                                                       : blocks[k];
        g.block_idx.x = (unsigned)(b % grid.x);
        g.block_idx.y = (unsigned)(b / grid.x % grid.y);
        g.block_idx.z = (unsigned)(b / ((unsigned long long)grid.x * grid.y));
        if (!run_block(g, how)) {
            set_error(cudaErrorLaunchFailure, "cudacpu: %s, block (%u,%u,%u) of grid (%u,%u,%u) "
                                              "x block (%u,%u,%u): %s",
                      kernel, g.block_idx.x, g.block_idx.y, g.block_idx.z, grid.x, grid.y,
                      grid.z, block.x, block.y, block.z, g.error.c_str());
            break;
        }
    }
    in_launch = false;
    running = nullptr;
}

void for_each_launched(void (*fn)(const char *kernel, unsigned long long launches, void *ctx),
                       void *ctx)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    for (const auto &kv : launches_by_kernel)
        fn(kv.first.c_str(), kv.second, ctx);
}

} // namespace cudacpu
