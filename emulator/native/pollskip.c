/* pollskip: preloaded into fabriclab's userspace switch daemons (ovs-vswitchd), it answers EAGAIN,
 * without a system call, to a non-blocking read on a descriptor that the same thread's last poll()
 * asked about and found empty.
 *
 * Why: each wake-up of a userspace datapath polls every descriptor it holds, then tries every one of
 * them in turn: each port's packet socket, the bridge's tap devices, its netlink sockets (one of them
 * five times, once per netdev class), its listening sockets and its latch pipe. Under shaped traffic a
 * wake-up carries one packet, so of a leaf's ~23 system calls per wake-up 15 were reads that poll()
 * had already answered with "nothing there", and failing accept() alone was 6 % of the daemon's CPU.
 *
 * Why it is safe: a daemon built on a poll loop (OVS's poll_block) reads non-blocking descriptors
 * until EAGAIN and then polls them again. Data that arrives between poll() and the read is therefore
 * not lost: the skipped read defers it to the next loop, whose poll() returns at once because the
 * descriptor is readable (level-triggered). Blocking reads are never skipped: a read blocks unless it
 * says MSG_DONTWAIT or its descriptor is O_NONBLOCK, which is cached per descriptor (one fcntl in its
 * life), forgotten on close() and updated by fcntl(F_SETFL). Only descriptors below MAX_FD are handled.
 *
 * poll() on epoll: the same daemon's poll() of its ~20 descriptors cost ~12 % of its CPU in the kernel
 * alone, re-arming and tearing down a wait-queue entry on every descriptor at every wake-up (sock_poll,
 * fdget, poll_freewait). One thread per process (the first whose poll() asks about EPOLL_MIN
 * descriptors or more: OVS's main loop) has its poll() answered by a level-triggered epoll set kept in
 * step with the descriptors it asks about: a descriptor is added the first time it is asked about,
 * modified when its events change, and removed when a call no longer asks about it (a descriptor left
 * registered would wake the thread for data it chose not to read) and before close(), dup2() or dup3()
 * replaces it (and again after, in case the polling thread asked about it in between). A call this
 * cannot answer exactly (a descriptor epoll refuses, such as a regular file, a closed descriptor, a
 * descriptor named twice, too many descriptors, a small poll() of the same thread) goes to the real
 * poll(). A file closed behind this library's back (close_range, glibc's own closes): the kernel drops
 * its registration when the file is gone, and every idle timeout and every VERIFY_EVERY calls the set is
 * checked and the descriptor added again; while the file lives on elsewhere (a dup) the kernel keeps a
 * registration no call can name, so when one fires, or a check finds our view wrong, the set is made
 * anew under the same number, and a wake-up only such registrations caused waits in the real poll().
 * Its own epoll descriptor closed or replaced: it gives up and leaves poll() to the kernel. No wait
 * lasts longer than MAX_WAIT_MS: should a registration ever miss a wake-up, it is late by at most that.
 * FABRICLAB_POLLSKIP_EPOLL=0 in the environment leaves poll() to the kernel.
 *
 * Wake-up moderation (FABRICLAB_POLLSKIP_LINGER_US=N, on epoll only): shaped traffic arrives paced, so
 * each wake-up carries one packet and pays for a whole turn of the daemon's loop, which tries every port.
 * While packets come densely (the last wait to return with I/O did so less than LINGER_DENSE lingers
 * ago, and wake-ups from sleep have come that often on average: a moving mean of their gaps, weight
 * 1/GAP_WEIGHT), a wait that finds nothing ready first sleeps N µs (at most the caller's timeout) and
 * then answers with everything ready by then, as a NIC's interrupt moderation does; only if nothing
 * came does it go on to wait as asked. A packet then waits N/2 on average and at most N, and a turn
 * costs one sleep.
 * Lingering after the wake-up instead (woken by a packet, sleep N/2, look again: the same mean wait for
 * the packet that woke it) cost two: on this kind of virtual machine a sleep and its wake-up cost ~50-80
 * µs of CPU whatever the turn then does. On the 4x4x4 leaf-spine at 1500 bytes and 2.83 Mb/s per host
 * this took context switches per delivered packet from 3.6-4.1 to 2.5-2.8, and OVS from 169-177 to
 * 160-165 µs of CPU per delivered packet (turn about).
 * Sparse traffic (a ping, a lone paced flow) is answered at once: a ping's reply comes soon after its
 * request, but the mean keeps the pings' spacing, so a reply does not wait a linger at every switch it
 * crosses (it did: an RTT through a 5 Mb/s hairpin in jumbo frames read 2.8 ms, not 0.7).
 * The runner sizes N to a fraction of a frame's time on the switch's fastest link (emulator/ovs_daemons.py,
 * linger_us).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 4096

/* Per thread: the generation of its last poll(), and for each descriptor the generation in which
 * poll() found it empty. A mark counts only while it equals the current generation. */
static __thread uint32_t generation;
static __thread uint32_t empty_in[MAX_FD];

/* Per process: 0 unknown, 1 non-blocking, 2 blocking. */
static unsigned char mode[MAX_FD];

static int (*real_poll)(struct pollfd *, nfds_t, int);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static int (*real_recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_fcntl)(int, int, ...);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

/* Resolved on first use: a wrapper may run before this library's constructors would. */
#define ENSURE(name) \
    do { \
        if (!real_##name) \
            real_##name = dlsym(RTLD_NEXT, #name); \
    } while (0)

static int is_nonblocking(int fd)
{
    if (!mode[fd]) {
        ENSURE(fcntl);
        int flags = real_fcntl(fd, F_GETFL);
        if (flags < 0)
            return 0;
        mode[fd] = (flags & O_NONBLOCK) ? 1 : 2;
    }
    return mode[fd] == 1;
}

/* True when the read on fd can be answered EAGAIN without asking the kernel. */
static int known_empty(int fd, int dontwait)
{
    if (fd < 0 || fd >= MAX_FD || !generation || empty_in[fd] != generation)
        return 0;
    return dontwait || is_nonblocking(fd);
}

#define SKIP_IF_EMPTY(fd, dontwait) \
    do { \
        if (known_empty((fd), (dontwait))) { \
            errno = EAGAIN; \
            return -1; \
        } \
    } while (0)

/* --- poll() on epoll -------------------------------------------------------------------------- */

#define EPOLL_MIN 8       /* a poll() asking about this many descriptors or more picks its thread */
#define EPOLL_MAX 256     /* a call asking about more goes to the real poll() */
#define VERIFY_EVERY 1024 /* calls between two checks that the kernel still holds every registration */
/* The longest one wait lasts (ms). A wake-up a stale registration missed is then late by at most this,
 * never for the tens of seconds a daemon's poll() may otherwise sleep; a wait cut short returns 0 (a
 * timeout), which OVS's poll loop takes as one more turn of its loop: ~one extra wake-up a second. */
#define MAX_WAIT_MS 1000
/* Wake-up moderation (see the top): a wait longer than SLEPT_NS slept; LINGER_DENSE lingers is "recent". */
#define SLEPT_NS 20000
#define LINGER_DENSE 4
#define GAP_WEIGHT 8
#define LINGER_MAX_US 50000 /* a bound on what the environment may ask for */
#define REGISTERED 0x80000000u /* in ep_events: the descriptor is in the set (EPOLLET, never used) */
#define POLL_WANTS (POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLRDHUP)

static pthread_mutex_t ep_lock = PTHREAD_MUTEX_INITIALIZER;
static int ep_state;              /* 0: no thread picked yet; 1: in use; -1: off (environment, fork, failure) */
static pthread_t ep_thread;       /* the thread whose poll() it answers */
static int ep_fd = -1;
static uint32_t ep_events[MAX_FD];   /* REGISTERED | the events the set holds for the descriptor */
static unsigned char ep_refused[MAX_FD]; /* epoll_ctl refused it (a regular file): real poll() */
static int ep_list[MAX_FD];           /* the registered descriptors, densely */
static int ep_slot[MAX_FD];           /* each one's place in ep_list */
static int ep_count;
static uint32_t ep_seen[MAX_FD];      /* the call that last asked about the descriptor */
static int ep_index[MAX_FD];          /* and where in that call's array */
static uint32_t ep_call;
static uint32_t ep_since_verify;
static int ep_verify_due;
static int ep_rebuild_due; /* the kernel may hold a registration we cannot name: start a fresh set */
static long ep_linger_ns;  /* wake-up moderation: how long a wake-up by I/O waits for more (0: off) */
static long ep_last_io_ns; /* when the last wait returned with I/O */
static long ep_last_woken_ns; /* when the last wait that slept was woken by I/O */
static long ep_mean_gap_ns; /* the moving mean of the gaps between such wake-ups (0: none measured yet) */

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void ep_child(void)
{
    /* A child forked once the set is in use shares it with the parent: it must never change it. One
     * forked before (a daemon detaching) picks a set of its own. The lock may have been held by a
     * thread the child does not have. */
    pthread_mutex_init(&ep_lock, NULL);
    if (ep_state == 1)
        ep_state = -1;
}

/* Registered at load, before any thread can fork while ep_pick holds the lock. */
__attribute__((constructor)) static void ep_init(void)
{
    pthread_atfork(NULL, NULL, ep_child);
}

static void ep_pick(void)
{
    pthread_mutex_lock(&ep_lock);
    if (ep_state == 0) {
        const char *env = getenv("FABRICLAB_POLLSKIP_EPOLL");
        if (env && strcmp(env, "0") == 0) {
            ep_state = -1;
        } else if ((ep_fd = epoll_create1(EPOLL_CLOEXEC)) < 0 || ep_fd >= MAX_FD) {
            ep_state = -1;
        } else {
            ep_thread = pthread_self();
            ep_state = 1;
            const char *linger = getenv("FABRICLAB_POLLSKIP_LINGER_US");
            if (linger) {
                long us = strtol(linger, NULL, 10);
                ep_linger_ns = (us > 0 && us <= LINGER_MAX_US) ? us * 1000 : 0;
            }
        }
    }
    pthread_mutex_unlock(&ep_lock);
}

static void ep_unlist(int fd)
{
    int k = ep_slot[fd];
    int last = ep_list[--ep_count];
    ep_list[k] = last;
    ep_slot[last] = k;
    ep_events[fd] = 0;
}

/* The descriptor is about to be closed or replaced: out of the set first (a file still open under
 * another descriptor would otherwise stay registered under this number). */
static void ep_forget(int fd)
{
    if (ep_state != 1 || fd < 0 || fd >= MAX_FD)
        return;
    int saved = errno;
    pthread_mutex_lock(&ep_lock);
    if (ep_state != 1) {
        /* turned off meanwhile */
    } else if (fd == ep_fd) { /* the program closes our set: give up on it */
        ep_state = -1;
    } else {
        ep_refused[fd] = 0;
        if (ep_events[fd] & REGISTERED) {
            epoll_ctl(ep_fd, EPOLL_CTL_DEL, fd, NULL);
            ep_unlist(fd);
        }
    }
    pthread_mutex_unlock(&ep_lock);
    errno = saved;
}

/* After close()/dup2()/dup3(): the owner may have registered the old file again in between. */
static void ep_forget_after(int fd)
{
    if (ep_state != 1 || fd < 0 || fd >= MAX_FD)
        return;
    int saved = errno;
    pthread_mutex_lock(&ep_lock);
    if (ep_state == 1 && fd != ep_fd && (ep_events[fd] & REGISTERED)) {
        ep_unlist(fd);
        ep_rebuild_due = 1;
    }
    pthread_mutex_unlock(&ep_lock);
    errno = saved;
}

/* Puts the descriptor in the set with these events (REGISTERED set), or out of reach: 0 or -1. */
static int ep_set(int fd, uint32_t want)
{
    struct epoll_event ev = {.events = want & ~REGISTERED, .data = {.fd = fd}};
    int registered = (ep_events[fd] & REGISTERED) != 0;
    int op = registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(ep_fd, op, fd, &ev) != 0) {
        /* The kernel's view differs from ours: it dropped a closed file's registration (MOD: ENOENT)
         * or holds one we did not make (ADD: EEXIST). */
        if (registered)
            ep_rebuild_due = 1; /* a registration dropped, or kept for a file still open elsewhere */
        if (errno == ENOENT || errno == EEXIST)
            op = (op == EPOLL_CTL_MOD) ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
        else
            op = -1;
        if (op < 0 || epoll_ctl(ep_fd, op, fd, &ev) != 0) {
            if (errno == EPERM)
                ep_refused[fd] = 1;
            if (registered)
                ep_unlist(fd);
            return -1;
        }
    }
    if (!registered) {
        ep_slot[fd] = ep_count;
        ep_list[ep_count++] = fd;
    }
    ep_events[fd] = want;
    return 0;
}

/* Re-asserts every registration, re-adding those the kernel dropped behind our back. */
static void ep_verify(void)
{
    for (int k = 0; k < ep_count;) {
        int fd = ep_list[k];
        if (ep_set(fd, ep_events[fd]) == 0)
            k++; /* else it was unlisted and another took slot k */
    }
    ep_since_verify = 0;
    ep_verify_due = 0;
}

/* A fresh set under the same number: stale registrations (a file closed behind our back but still
 * open elsewhere) cannot be deleted, only dropped with the set. Called with ep_lock held. */
static void ep_rebuild(void)
{
    ep_rebuild_due = 0;
    int nfd = epoll_create1(EPOLL_CLOEXEC);
    ENSURE(dup3);
    ENSURE(close);
    if (nfd < 0 || real_dup3(nfd, ep_fd, O_CLOEXEC) < 0) {
        if (nfd >= 0)
            real_close(nfd);
        ep_state = -1;
        return;
    }
    real_close(nfd);
    for (int k = 0; k < ep_count;) {
        int fd = ep_list[k];
        struct epoll_event ev = {.events = ep_events[fd] & ~REGISTERED, .data = {.fd = fd}};
        if (epoll_ctl(ep_fd, EPOLL_CTL_ADD, fd, &ev) == 0)
            k++;
        else
            ep_unlist(fd);
    }
}

/* poll() answered from the epoll set; -2 when this call must go to the real poll(). */
static int ep_poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    struct epoll_event evs[EPOLL_MAX];
    if (nfds > EPOLL_MAX)
        return -2;
    pthread_mutex_lock(&ep_lock);
    if (ep_state != 1) {
        pthread_mutex_unlock(&ep_lock);
        return -2;
    }
    if (ep_rebuild_due)
        ep_rebuild();
    if (ep_state != 1) {
        pthread_mutex_unlock(&ep_lock);
        return -2;
    }
    uint32_t call = ++ep_call;
    if (call == 0) {
        memset(ep_seen, 0, sizeof ep_seen);
        call = ep_call = 1;
    }
    int asked = 0;
    for (nfds_t i = 0; i < nfds; i++) {
        int fd = fds[i].fd;
        fds[i].revents = 0;
        if (fd < 0)
            continue;
        asked++;
        if (fd >= MAX_FD || ep_seen[fd] == call || ep_refused[fd])
            goto refuse; /* out of range, named twice, or a file epoll cannot watch */
        ep_seen[fd] = call;
        ep_index[fd] = (int)i;
        uint32_t want = ((uint32_t)fds[i].events & POLL_WANTS) | REGISTERED;
        if (ep_events[fd] != want && ep_set(fd, want) != 0)
            goto refuse; /* closed (poll reports POLLNVAL) or refused */
    }
    /* Descriptors this call does not ask about leave the set: level-triggered, data the caller chose
     * not to read would otherwise wake it at once, again and again. Every registered one was asked
     * about when the counts agree (each asked descriptor is registered and named once). */
    for (int k = 0; asked != ep_count && k < ep_count;) {
        int fd = ep_list[k];
        if (ep_seen[fd] != call) {
            epoll_ctl(ep_fd, EPOLL_CTL_DEL, fd, NULL);
            ep_unlist(fd);
        } else {
            k++;
        }
    }
    if (ep_verify_due || ++ep_since_verify >= VERIFY_EVERY)
        ep_verify();
    int epfd = ep_fd;
    pthread_mutex_unlock(&ep_lock);

    int wait = (timeout < 0 || timeout > MAX_WAIT_MS) ? MAX_WAIT_MS : timeout;
    long before = ep_linger_ns && wait != 0 ? now_ns() : 0;
    long dense = LINGER_DENSE * ep_linger_ns;
    int lingers = before && before - ep_last_io_ns < dense && ep_mean_gap_ns && ep_mean_gap_ns < dense;
    int n;
    if (!lingers) {
        n = epoll_wait(epfd, evs, EPOLL_MAX, wait);
    } else if ((n = epoll_wait(epfd, evs, EPOLL_MAX, 0)) == 0) {
        /* Packets come densely and none is waiting (one that is goes at once: it waited through the
         * caller's turn): sleep through what comes meanwhile, within the caller's timeout, then take
         * it all in one turn. */
        long linger = ep_linger_ns < wait * 1000000L ? ep_linger_ns : wait * 1000000L;
        struct timespec l = {linger / 1000000000L, linger % 1000000000L};
        nanosleep(&l, NULL);
        n = epoll_wait(epfd, evs, EPOLL_MAX, 0);
        int rest = wait - (int)((linger + 999999) / 1000000);
        if (n == 0 && rest > 0)
            n = epoll_wait(epfd, evs, EPOLL_MAX, rest); /* it went quiet: wait as asked */
    }
    if (n > 0 && before) {
        long after = now_ns();
        ep_last_io_ns = after;
        if (after - before > SLEPT_NS) {
            /* Only wake-ups from sleep feed the mean: a turn that finds more ready at once is no wake-up,
             * and several such turns after each one would hide the spacing of the wake-ups. */
            long gap = after - ep_last_woken_ns;
            if (ep_last_woken_ns)
                ep_mean_gap_ns = ep_mean_gap_ns ? ep_mean_gap_ns + (gap - ep_mean_gap_ns) / GAP_WEIGHT : gap;
            ep_last_woken_ns = after;
        }
    }
    if (n < 0) {
        if (errno == EINTR)
            return -1; /* as poll() would */
        pthread_mutex_lock(&ep_lock); /* EBADF, EINVAL: our set was closed or replaced behind our back */
        ep_state = -1;
        pthread_mutex_unlock(&ep_lock);
        return -2;
    }
    int ready = 0;
    for (int j = 0; j < n; j++) {
        int fd = evs[j].data.fd;
        if (fd < 0 || fd >= MAX_FD || ep_seen[fd] != call) {
            ep_rebuild_due = 1; /* a registration we did not keep: stale */
            continue;
        }
        struct pollfd *p = &fds[ep_index[fd]];
        p->revents = (short)(evs[j].events & ((uint32_t)(unsigned short)p->events | POLLERR | POLLHUP));
        if (p->revents)
            ready++;
    }
    if (n > 0 && ready == 0)
        return -2; /* only stale registrations fired: let the kernel's poll() wait instead of returning early */
    if (n == 0 && wait != 0)
        ep_verify_due = 1; /* an idle spell: check before the next wait that nothing was dropped */
    return ready;

refuse:
    pthread_mutex_unlock(&ep_lock);
    return -2;
}

int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    ENSURE(poll);
    if (ep_state == 0 && nfds >= EPOLL_MIN)
        ep_pick();
    int n = -2;
    if (ep_state == 1 && nfds >= EPOLL_MIN && pthread_equal(pthread_self(), ep_thread))
        n = ep_poll(fds, nfds, timeout);
    if (n == -2)
        n = real_poll(fds, nfds, timeout);
    int saved = errno;
    if (++generation == 0)
        generation = 1;
    if (n >= 0) {
        for (nfds_t i = 0; i < nfds; i++) {
            int fd = fds[i].fd;
            if (fd >= 0 && fd < MAX_FD && (fds[i].events & POLLIN) && fds[i].revents == 0)
                empty_in[fd] = generation;
        }
    }
    errno = saved;
    return n;
}

ssize_t read(int fd, void *buf, size_t count)
{
    SKIP_IF_EMPTY(fd, 0);
    ENSURE(read);
    return real_read(fd, buf, count);
}

ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
    SKIP_IF_EMPTY(fd, 0);
    ENSURE(readv);
    return real_readv(fd, iov, iovcnt);
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    SKIP_IF_EMPTY(fd, flags & MSG_DONTWAIT);
    ENSURE(recv);
    return real_recv(fd, buf, len, flags);
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr, socklen_t *addrlen)
{
    SKIP_IF_EMPTY(fd, flags & MSG_DONTWAIT);
    ENSURE(recvfrom);
    return real_recvfrom(fd, buf, len, flags, addr, addrlen);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    /* MSG_ERRQUEUE reads a queue that poll() reports as POLLERR, not POLLIN. */
    if (!(flags & MSG_ERRQUEUE))
        SKIP_IF_EMPTY(fd, flags & MSG_DONTWAIT);
    ENSURE(recvmsg);
    return real_recvmsg(fd, msg, flags);
}

int recvmmsg(int fd, struct mmsghdr *msgs, unsigned int vlen, int flags, struct timespec *timeout)
{
    if (!(flags & MSG_ERRQUEUE))
        SKIP_IF_EMPTY(fd, flags & MSG_DONTWAIT);
    ENSURE(recvmmsg);
    return real_recvmmsg(fd, msgs, vlen, flags, timeout);
}

int accept(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
    SKIP_IF_EMPTY(fd, 0);
    ENSURE(accept);
    return real_accept(fd, addr, addrlen);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
    SKIP_IF_EMPTY(fd, 0);
    ENSURE(accept4);
    return real_accept4(fd, addr, addrlen, flags);
}

static void forget(int fd)
{
    if (fd >= 0 && fd < MAX_FD) {
        mode[fd] = 0;
        empty_in[fd] = 0;
    }
}

int close(int fd)
{
    ep_forget(fd);
    forget(fd);
    ENSURE(close);
    int r = real_close(fd);
    ep_forget_after(fd);
    return r;
}

int dup2(int oldfd, int newfd)
{
    ENSURE(dup2);
    if (oldfd != newfd)
        ep_forget(newfd);
    int r = real_dup2(oldfd, newfd);
    if (oldfd != newfd)
        ep_forget_after(newfd);
    if (r >= 0)
        forget(r);
    return r;
}

int dup3(int oldfd, int newfd, int flags)
{
    ENSURE(dup3);
    ep_forget(newfd);
    int r = real_dup3(oldfd, newfd, flags);
    ep_forget_after(newfd);
    if (r >= 0)
        forget(r);
    return r;
}

int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    ENSURE(fcntl);
    int r = real_fcntl(fd, cmd, arg);
    if (fd >= 0 && fd < MAX_FD) {
        if (cmd == F_SETFL && r == 0)
            mode[fd] = (arg & O_NONBLOCK) ? 1 : 2;
        else if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
            if (r >= 0 && r < MAX_FD)
                mode[r] = 0;
    }
    return r;
}

/* Programs built with large-file support call fcntl64: the same function. */
int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));
