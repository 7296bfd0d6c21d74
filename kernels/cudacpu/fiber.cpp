/*
 * fiber.cpp — runs a CUDA grid on the CPU.  The blocks of the grid run one
 * after another; the threads of a block take turns, each running until it
 * waits (at a barrier or a warp collective) or returns.  A thread runs on a
 * fiber (a context with a stack of its own) from the pool: a thread that waits
 * keeps its fiber until it resumes and returns, and a fiber whose thread
 * has returned goes straight on with the next thread the schedule would
 * start, so a block whose threads never wait costs one switch, not one per
 * thread.  See cudacpu.h for what this checks.
 *
 * Switching.  glibc's swapcontext saves and restores the signal mask, a
 * system call on every switch (about 0.33 us here, which made the
 * simulator's test suite spend most of its minutes in the kernel); on
 * x86-64 a switch is a swap of the callee-saved registers and the stack
 * pointer instead (about 16 ns), with ucontext (makecontext/swapcontext)
 * elsewhere and wherever CUDACPU_UCONTEXT=1 is defined (one of the test
 * builds, so that both ways run).
 *
 * Sanitizers.  Under AddressSanitizer each switch tells ASan which stack it
 * moves to (__sanitizer_start/finish_switch_fiber).  Under ThreadSanitizer
 * (built with CUDACPU_TSAN=1; this file itself is left uninstrumented, its
 * bookkeeping is not the kernel's) every CUDA thread has its own TSan
 * context, switches create no happens-before, and the only orderings TSan
 * sees are CUDA's: a barrier orders everything before it in the block
 * before everything after it, a warp collective does the same for its
 * warp, and consecutive blocks are ordered (their __shared__ variables are
 * the same memory here, not on a GPU), so TSan reports the races between
 * the threads of one block.
 */
#include "cudacpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#if !defined(__x86_64__) || (defined(CUDACPU_UCONTEXT) && CUDACPU_UCONTEXT)
#include <ucontext.h>
#define CUDACPU_USE_UCONTEXT 1
#endif
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <map>
#include <memory>
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

namespace cudacpu
{
namespace
{

constexpr int kWarp = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;

enum class State { Ready, AtBarrier, AtWarp, Done };

enum class Order { Forward, Reverse, Random };

struct Thread;

/* Where a fiber (or the scheduler) that switched away resumes. */
struct Context {
#ifdef CUDACPU_USE_UCONTEXT
    ucontext_t uc;
#else
    void *sp = nullptr; /* its stack, holding the registers it saved */
#endif
};

/* A stack and a context to run threads on, kept for the process. */
struct Fiber {
    Context ctx;
    char *stack = nullptr; /* lowest usable byte, above a guard page */
    size_t size = 0;
    Thread *thread = nullptr; /* the thread it runs; null: idle */
    bool fresh = true;        /* ctx must be made before it runs */
};

struct Thread {
    Fiber *fiber = nullptr; /* null: not started, or returned */
    uint3 idx;
    int linear = 0;
    unsigned long long trips = 0; /* GA_TRIP()s of this thread in this block */
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
    std::vector<int> order;    /* this pass's order of the threads */
    size_t pos = 0;            /* the next of `order` to consider */
    Thread *current = nullptr; /* the thread that runs, else null (the scheduler) */
    Context scheduler;
    bool failed = false;
    std::string error;
    unsigned long long max_trips = 0, blocks_run = 0;
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
Grid *running = nullptr; /* under launch_mutex */
thread_local bool in_launch = false;
std::vector<std::unique_ptr<Fiber>> fibers; /* under launch_mutex, as the rest */
std::vector<Fiber *> idle;
#ifdef CUDACPU_TSAN
std::vector<void *> tsan_threads; /* a TSan context per thread index of a block */
#endif
struct GridLimit {
    std::string kernel;
    dim3 max;
};
std::vector<GridLimit> grid_limits;
std::map<std::string, unsigned long long> launches_by_kernel;
bool recording = false, sampling = false;
std::vector<LaunchRecord> launch_records;
unsigned long long rng_state = 0;
std::string rng_seeded_for; /* the schedule string rng_state was seeded for */

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

/* ------------------------------------------------------------- fibers */

size_t stack_bytes()
{
    const char *env = getenv("GPUACCEL_CUDACPU_STACK_KIB");
    long kib = env && *env ? atol(env) : 256;
    if (kib < 64)
        kib = 64;
    long page = sysconf(_SC_PAGESIZE);
    return ((size_t)kib * 1024 + (size_t)page - 1) / (size_t)page * (size_t)page;
}

void fiber_main();

Fiber *new_fiber()
{
    size_t size = stack_bytes(), page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return nullptr;
    mprotect(p, page, PROT_NONE); /* an overflow faults instead of corrupting */
    std::unique_ptr<Fiber> f(new Fiber);
    f->stack = (char *)p + page;
    f->size = size;
    fibers.push_back(std::move(f));
    return fibers.back().get();
}

#ifdef CUDACPU_TSAN
/* Under TSan a thread index has a fiber of its own: TSan would take the
 * stack slots that one thread leaves to another for a race between them. */
std::vector<Fiber *> fiber_of_index;

Fiber *take_fiber(const Thread &t)
{
    while (fiber_of_index.size() <= (size_t)t.linear)
        fiber_of_index.push_back(nullptr);
    Fiber *&f = fiber_of_index[(size_t)t.linear];
    if (!f)
        f = new_fiber();
    return f;
}

void give_back(Fiber *) {}
#else
Fiber *take_fiber(const Thread &)
{
    if (idle.empty())
        return new_fiber();
    Fiber *f = idle.back();
    idle.pop_back();
    return f;
}

void give_back(Fiber *f)
{
    idle.push_back(f);
}
#endif

#ifdef CUDACPU_USE_UCONTEXT
void make_fresh(Fiber *f)
{
    getcontext(&f->ctx.uc);
    f->ctx.uc.uc_stack.ss_sp = f->stack;
    f->ctx.uc.uc_stack.ss_size = f->size;
    f->ctx.uc.uc_link = nullptr;
    makecontext(&f->ctx.uc, fiber_main, 0);
    f->fresh = false;
}

#ifdef CUDACPU_ASAN
/* libc's own swapcontext, not ASan's interceptor of it: the interceptor
 * clears the shadow of the whole target stack on every switch (which
 * would hide an overflow of a waiting thread's locals, and is slow); the
 * switches are announced with __sanitizer_start_switch_fiber instead. */
void switch_context(Context *from, Context *to)
{
    using Swap = int (*)(ucontext_t *, const ucontext_t *);
    static Swap libc_swap = [] {
        void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
        void *sym = libc ? dlsym(libc, "swapcontext") : nullptr;
        return sym ? (Swap)sym : &swapcontext;
    }();
    libc_swap(&from->uc, &to->uc);
}
#else
void switch_context(Context *from, Context *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

#else /* x86-64 */

/* Saves the callee-saved registers, the SSE and x87 control words and the
 * stack pointer on the current stack (that sp in *save), then restores
 * those of the stack at `load` and returns there.  The System V AMD64 ABI
 * leaves every other register to the caller. */
extern "C" void cudacpu_switch_stacks(void **save, void *load);
asm(R"(
    .text
    .p2align 4
    .globl cudacpu_switch_stacks
    .hidden cudacpu_switch_stacks
    .type cudacpu_switch_stacks, @function
cudacpu_switch_stacks:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudacpu_switch_stacks, .-cudacpu_switch_stacks
)");

/* A fresh fiber's stack as cudacpu_switch_stacks leaves one: zeroed
 * registers, the current control words, and fiber_main to return to with
 * the stack aligned as at a call. */
void make_fresh(Fiber *f)
{
    void **sp = (void **)((uintptr_t)(f->stack + f->size) & ~(uintptr_t)15);
    *--sp = nullptr; /* fiber_main's own return address: it never returns */
    *--sp = (void *)&fiber_main;
    for (int k = 0; k < 6; k++)
        *--sp = nullptr;
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
    *--sp = nullptr;
    memcpy(sp, &mxcsr, 4);
    memcpy((char *)sp + 4, &fpcw, 2);
    f->ctx.sp = sp;
    f->fresh = false;
}

void switch_context(Context *from, Context *to)
{
    cudacpu_switch_stacks(&from->sp, to->sp);
}

#endif

#ifdef CUDACPU_TSAN
void *tsan_context(const Thread &t)
{
    while (tsan_threads.size() <= (size_t)t.linear)
        tsan_threads.push_back(__tsan_create_fiber(0));
    return tsan_threads[(size_t)t.linear];
}
#endif

/* From the scheduler to the fiber of g.current. */
void resume(Grid &g, Thread *t)
{
    Fiber *f = t->fiber;
    if (f->fresh)
        make_fresh(f);
    g.current = t;
#ifdef CUDACPU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(tsan_context(*t), __tsan_switch_to_fiber_no_sync);
#endif
    switch_context(&g.scheduler, &f->ctx);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    g.current = nullptr;
}

/* From a fiber back to the scheduler. */
void suspend(Grid &g, Fiber *f)
{
#ifdef CUDACPU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, g.scheduler_stack, g.scheduler_stack_size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(g.scheduler_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    switch_context(&f->ctx, &g.scheduler);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* The thread the scheduler would start next in this pass, if it is one
 * that has not started: a fiber whose thread returned runs it at once. */
Thread *next_to_start(Grid &g)
{
    while (g.pos < g.order.size()) {
        Thread &t = g.threads[(size_t)g.order[g.pos]];
        if (t.state != State::Ready) {
            g.pos++;
            continue;
        }
        if (t.fiber)
            return nullptr; /* a waiting thread to resume: the scheduler's job */
        g.pos++;
        return &t;
    }
    return nullptr;
}

void fiber_main()
{
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    for (;;) {
        Grid &g = *running;
        Thread *t = g.current;
        Fiber *f = t->fiber;
        for (;;) {
#ifdef CUDACPU_TSAN
            __tsan_acquire(&g.block_start);
#endif
            g.body(g.closure);
            t->state = State::Done;
            t->fiber = nullptr;
#ifdef CUDACPU_TSAN
            __tsan_release(&g.block_end);
#endif
#ifdef CUDACPU_TSAN
            break; /* each thread on its own fiber */
#endif
            t = next_to_start(g);
            if (!t)
                break;
            t->fiber = f;
            f->thread = t;
            g.current = t;
#ifdef CUDACPU_TSAN
            __tsan_switch_to_fiber(tsan_context(*t), __tsan_switch_to_fiber_no_sync);
#endif
        }
        f->thread = nullptr;
        give_back(f);
        suspend(g, f); /* resumed with a new thread to run */
    }
}

/* Stops the launch from inside a fiber: the block is abandoned. */
void fail_in_fiber(Grid &g, Thread *t, std::string message)
{
    g.failed = true;
    g.error = std::move(message);
    suspend(g, t->fiber); /* never resumed */
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
    return op == WARP_SHFL_IDX || op == WARP_SHFL_UP || op == WARP_SHFL_DOWN || op == WARP_SHFL_XOR;
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
        case State::Done: continue;
        case State::Ready: waiting = true; break;
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
                *why = format("%s reads lane %d, which %s", describe_collective(g, t).c_str(), src,
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

/* Gives back the fibers of a failed block's threads, made afresh before
 * their next use. */
void abandon(Grid &g)
{
    for (Thread &t : g.threads) {
        Fiber *f = t.fiber;
        if (!f)
            continue;
#ifdef CUDACPU_ASAN
        __asan_unpoison_memory_region(f->stack, f->size); /* frames never unwound */
#endif
#ifdef CUDACPU_TSAN
        __tsan_destroy_fiber(tsan_threads[(size_t)t.linear]); /* its shadow stack, too */
        tsan_threads[(size_t)t.linear] = __tsan_create_fiber(0);
#endif
        f->fresh = true;
        f->thread = nullptr;
        t.fiber = nullptr;
        give_back(f);
    }
}

bool run_block(Grid &g, Order how)
{
    for (int i = 0; i < g.nthreads; i++) {
        Thread &t = g.threads[(size_t)i];
        t.fiber = nullptr;
        t.linear = i;
        t.idx.x = (unsigned)i % g.block.x;
        t.idx.y = (unsigned)i / g.block.x % g.block.y;
        t.idx.z = (unsigned)i / (g.block.x * g.block.y);
        t.state = State::Ready;
        t.trips = 0;
    }
#ifdef CUDACPU_TSAN
    __tsan_release(&g.block_start);
#endif
    g.order.resize((size_t)g.nthreads);
    order_indices(g.order, how);
    for (;;) {
        bool ran = false;
        for (g.pos = 0; g.pos < g.order.size();) {
            Thread &t = g.threads[(size_t)g.order[g.pos++]];
            if (t.state != State::Ready)
                continue;
            if (!t.fiber) {
                t.fiber = take_fiber(t);
                if (!t.fiber) {
                    g.error = format("no memory for a fiber stack of %zu bytes", stack_bytes());
                    g.failed = true;
                } else {
                    t.fiber->thread = &t;
                }
            }
            if (!g.failed)
                resume(g, &t);
            ran = true;
            if (g.failed) {
                abandon(g);
                return false;
            }
        }
        if (how == Order::Random)
            order_indices(g.order, how);
        if (ran)
            continue;
        bool all_done = true;
        for (const Thread &t : g.threads)
            all_done = all_done && t.state == State::Done;
        if (all_done)
            break;
        if (!unblock(g, g.order, how)) {
            g.failed = true;
            abandon(g);
            return false;
        }
    }
#ifdef CUDACPU_TSAN
    __tsan_acquire(&g.block_end);
#endif
    for (const Thread &t : g.threads)
        g.max_trips = std::max(g.max_trips, t.trips);
    g.blocks_run++;
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
    if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
        *why = format("grid (%u,%u,%u): x in [1, 2^31-1], y and z in [1, 65535]", grid.x, grid.y,
                      grid.z);
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
    suspend(g, t->fiber);
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
        fail_in_fiber(g, t,
                      format("%s: the mask does not name the calling lane %d",
                             describe_collective(g, *t).c_str(), lane));
    if (lanes < kWarp && mask >> lanes)
        fail_in_fiber(g, t,
                      format("%s names lanes that warp %d of this block lacks (it has "
                             "lanes 0-%d)",
                             describe_collective(g, *t).c_str(), t->linear / kWarp, lanes - 1));
    if (is_shuffle(op) && (width < 1 || width > kWarp || (width & (width - 1))))
        fail_in_fiber(g, t,
                      format("%s: width %d is not a power of two up to 32",
                             describe_collective(g, *t).c_str(), width));
#ifdef CUDACPU_TSAN
    __tsan_release(&g.warps[t->linear / kWarp]);
#endif
    std::string why;
    Progress p = try_complete(g, warp_base, *t, &why);
    if (p == Progress::Failed)
        fail_in_fiber(g, t, why);
    if (p == Progress::Waiting)
        suspend(g, t->fiber);
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
        set_error(cudaErrorInvalidConfiguration, "cudacpu: launch of %s: %s", kernel, why.c_str());
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
    dim3 asked = grid;
    apply_grid_limit(name, &grid);
    Grid g;
    g.kernel = kernel;
    g.grid = grid;
    g.block = block;
    g.body = body;
    g.closure = closure;
    g.nthreads = (int)(block.x * block.y * block.z);
    g.threads.resize((size_t)g.nthreads);
#ifdef CUDACPU_ASAN
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *addr = nullptr;
        size_t size = 0;
        pthread_attr_getstack(&attr, &addr, &size);
        g.scheduler_stack = addr;
        g.scheduler_stack_size = size;
        pthread_attr_destroy(&attr);
    }
#endif
#ifdef CUDACPU_TSAN
    g.scheduler_fiber = __tsan_get_current_fiber();
#endif
    unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    /* random order of the blocks: k -> (a k + c) mod n with a coprime to
     * n, a permutation that needs no table however large the grid */
    unsigned long long a = 1, c = 0;
    if (how == Order::Random && nblocks > 1) {
        c = next_random() % nblocks;
        do
            a = 1 + next_random() % (nblocks - 1);
        while (std::gcd(a, nblocks) != 1);
    }
    running = &g;
    in_launch = true;
    for (unsigned long long k = 0; k < nblocks; k++) {
        unsigned long long b = how == Order::Forward ? k
                               : how == Order::Reverse
                                   ? nblocks - 1 - k
                                   : (unsigned long long)(((unsigned __int128)a * k + c) % nblocks);
        if (sampling && b != 0 && b != nblocks - 1)
            continue;
        g.block_idx.x = (unsigned)(b % grid.x);
        g.block_idx.y = (unsigned)(b / grid.x % grid.y);
        g.block_idx.z = (unsigned)(b / ((unsigned long long)grid.x * grid.y));
        if (!run_block(g, how)) {
            set_error(cudaErrorLaunchFailure,
                      "cudacpu: %s, block (%u,%u,%u) of grid (%u,%u,%u) "
                      "x block (%u,%u,%u): %s",
                      kernel, g.block_idx.x, g.block_idx.y, g.block_idx.z, grid.x, grid.y, grid.z,
                      block.x, block.y, block.z, g.error.c_str());
            break;
        }
    }
    in_launch = false;
    running = nullptr;
    if (recording) {
        LaunchRecord r;
        snprintf(r.kernel, sizeof r.kernel, "%s", name.c_str());
        r.grid = asked;
        r.block = block;
        r.blocks_run = g.blocks_run;
        r.max_trips = g.max_trips;
        launch_records.push_back(r);
    }
}

void for_each_launched(void (*fn)(const char *kernel, unsigned long long launches, void *ctx),
                       void *ctx)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    for (const auto &kv : launches_by_kernel)
        fn(kv.first.c_str(), kv.second, ctx);
}

void count_trip()
{
    Thread *t = running_thread();
    if (t)
        t->trips++;
}

void record_launches(bool on)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    recording = on;
    if (on)
        launch_records.clear();
}

void for_each_launch(void (*fn)(const LaunchRecord &launch, void *ctx), void *ctx)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    for (const LaunchRecord &r : launch_records)
        fn(r, ctx);
}

void sample_blocks(bool on)
{
    std::lock_guard<std::mutex> lock(launch_mutex);
    sampling = on;
}

} // namespace cudacpu
