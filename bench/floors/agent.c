/*
 * agent.c: the floor of corral's architecture, in C. The bench compiles it
 * at start (gcc -O2) and starts it in new user, mount, pid, net, ipc and
 * uts namespaces, as corral's worker starts a machine's init; fd 3 is a
 * SOCK_SEQPACKET socket to the bench (or to a relay in front of it).
 *
 * Each request packet carries three descriptors (stdin, stdout, stderr;
 * SCM_RIGHTS) and a body:
 *
 *	u32 id | cwd NUL | argv[0] NUL ... argv[n-1] NUL | NUL | env NUL ...
 *
 * For each, the agent does corral's init's steps and nothing else: a PATH
 * lookup of argv[0], stdio made blocking, entry into a held pid and mount
 * namespace (a holder process, through its pidfd), vfork + exec as uid and
 * gid 1000 in a new session in cwd, return to its own namespaces, and a
 * "started" packet. A SIGCHLD (signalfd) reaps and reports "exit". Replies
 * are u32 id | u8 op (1 started, 2 exit, 3 not started) | i32 wait status.
 * EOF on fd 3 ends the agent, and with it (PID 1) its namespace.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CTL 3
#define MAXARGS 256
#define MAXSESS 4096
#define GUEST 1000

static struct { pid_t pid; uint32_t id; } sess[MAXSESS];
static volatile int child_errno;

static void reply(uint32_t id, uint8_t op, int32_t status) {
	char b[9];
	memcpy(b, &id, 4);
	b[4] = (char)op;
	memcpy(b + 5, &status, 4);
	if (send(CTL, b, sizeof b, MSG_NOSIGNAL) < 0 && errno != EINTR)
		_exit(0);
}

static int lookpath(const char *file, const char *path, char *out, size_t n) {
	struct stat st;
	if (strchr(file, '/')) {
		snprintf(out, n, "%s", file);
		return 0;
	}
	while (path && *path) {
		const char *end = strchrnul(path, ':');
		int len = (int)(end - path);
		snprintf(out, n, "%.*s/%s", len ? len : 1, len ? path : ".", file);
		if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
			return 0;
		path = *end ? end + 1 : end;
	}
	return -1;
}

static void start(char *buf, ssize_t n, int *fds, int holder, int ownmnt, int ownpid) {
	uint32_t id;
	char *argv[MAXARGS + 1], *envp[MAXARGS + 1], path[4096];
	int argc = 0, envc = 0;
	memcpy(&id, buf, 4);
	char *p = buf + 4, *end = buf + n;
	char *cwd = p;
	p += strlen(p) + 1;
	while (p < end && *p && argc < MAXARGS) {
		argv[argc++] = p;
		p += strlen(p) + 1;
	}
	argv[argc] = NULL;
	p++;
	const char *pathenv = "/usr/bin:/bin";
	while (p < end && envc < MAXARGS) {
		envp[envc++] = p;
		if (strncmp(p, "PATH=", 5) == 0)
			pathenv = p + 5;
		p += strlen(p) + 1;
	}
	envp[envc] = NULL;
	if (argc == 0 || lookpath(argv[0], pathenv, path, sizeof path) < 0) {
		reply(id, 3, ENOENT);
		return;
	}
	for (int i = 0; i < 3; i++) {
		int fl = fcntl(fds[i], F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK))
			fcntl(fds[i], F_SETFL, fl & ~O_NONBLOCK);
	}
	if (setns(holder, CLONE_NEWPID | CLONE_NEWNS) < 0) {
		reply(id, 3, errno);
		return;
	}
	child_errno = 0;
	pid_t pid = vfork();
	if (pid == 0) {
		/* Raw system calls only: the child shares the agent's memory. */
		syscall(SYS_setsid);
		for (int i = 0; i < 3; i++)
			if (syscall(SYS_dup3, fds[i], i, 0) < 0 && fds[i] != i)
				goto fail;
		if (syscall(SYS_chdir, cwd) < 0 ||
		    syscall(SYS_setgroups, 0, NULL) < 0 ||
		    syscall(SYS_setresgid, GUEST, GUEST, GUEST) < 0 ||
		    syscall(SYS_setresuid, GUEST, GUEST, GUEST) < 0)
			goto fail;
		syscall(SYS_execve, path, argv, envp);
	fail:
		child_errno = errno;
		syscall(SYS_exit, 127);
	}
	int ferr = errno;
	if (setns(ownmnt, CLONE_NEWNS) < 0 || setns(ownpid, CLONE_NEWPID) < 0)
		_exit(1); /* cannot go on outside its own namespaces */
	if (pid < 0 || child_errno) {
		if (pid > 0)
			waitpid(pid, NULL, 0);
		reply(id, 3, pid < 0 ? ferr : child_errno);
		return;
	}
	for (int i = 0; i < MAXSESS; i++)
		if (sess[i].pid == 0) {
			sess[i].pid = pid;
			sess[i].id = id;
			break;
		}
	reply(id, 1, 0);
}

int main(void) {
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);
	int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	int ownmnt = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
	int ownpid = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	fcntl(CTL, F_SETFD, FD_CLOEXEC);
	if (sfd < 0 || ownmnt < 0 || ownpid < 0) {
		perror("agent: setup");
		return 1;
	}
	/* The holder: PID 1 of a pid namespace (and a mount namespace) of its
	 * own, as corral's sessions run in a held namespace. */
	pid_t hpid = (pid_t)syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, NULL, NULL, NULL, NULL);
	if (hpid == 0) {
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		for (;;)
			pause();
	}
	int holder = (int)syscall(SYS_pidfd_open, hpid, 0);
	if (hpid < 0 || holder < 0) {
		perror("agent: holder");
		return 1;
	}
	fcntl(holder, F_SETFD, FD_CLOEXEC);
	static char buf[65536];
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct pollfd pf[2] = {{.fd = CTL, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
	for (;;) {
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (pf[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) == sizeof si)
				;
			int st;
			pid_t pid;
			while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
				for (int i = 0; i < MAXSESS; i++)
					if (sess[i].pid == pid) {
						sess[i].pid = 0;
						reply(sess[i].id, 2, st);
						break;
					}
		}
		if (pf[0].revents) {
			struct iovec iov = {buf, sizeof buf};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
			ssize_t n = recvmsg(CTL, &mh, MSG_CMSG_CLOEXEC);
			if (n <= 0) {
				if (n < 0 && errno == EINTR)
					continue;
				kill(hpid, SIGKILL);
				return 0;
			}
			int fds[3] = {-1, -1, -1}, nfd = 0;
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
				if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
					nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
					memcpy(fds, CMSG_DATA(c), (nfd > 3 ? 3 : nfd) * sizeof(int));
				}
			if (n >= 5 && nfd == 3)
				start(buf, n, fds, holder, ownmnt, ownpid);
			else if (n >= 4) {
				uint32_t id;
				memcpy(&id, buf, 4);
				reply(id, 3, EINVAL);
			}
			for (int i = 0; i < 3; i++)
				if (fds[i] >= 0)
					close(fds[i]);
		}
	}
}
