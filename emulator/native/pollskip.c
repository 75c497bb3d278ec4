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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
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

int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    ENSURE(poll);
    int n = real_poll(fds, nfds, timeout);
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
    forget(fd);
    ENSURE(close);
    return real_close(fd);
}

int dup2(int oldfd, int newfd)
{
    ENSURE(dup2);
    int r = real_dup2(oldfd, newfd);
    if (r >= 0)
        forget(r);
    return r;
}

int dup3(int oldfd, int newfd, int flags)
{
    ENSURE(dup3);
    int r = real_dup3(oldfd, newfd, flags);
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
