"""The container's seccomp profile: an allowlist, everything else fails with EPERM.

The list is Docker's default profile (moby ``profiles/seccomp/default.json``) without the
calls it grants only with capabilities we drop anyway (``mount``, ``bpf``, ``ptrace``,
``perf_event_open``, ``kexec_*``, module loading, ``clock_settime``, ``reboot``, namespace
calls ``unshare``/``setns``/``clone3`` with namespace flags ...). A boot that needs a call not
listed would fail at run time, so the build checks the syscalls its strace saw against
:data:`ALLOWED` and refuses, naming them (:func:`check_traced`). Names the kernel or
libseccomp of the target does not know are skipped by runc, so one list serves x86_64 and
aarch64.

Added to Docker's unconditional list: ``mbind`` (ONNX Runtime sets NUMA policy on its own
buffers; moving other processes' pages needs CAP_SYS_NICE, which we do not have). The other
NUMA policy calls, ``get_mempolicy``/``set_mempolicy``/``set_mempolicy_home_node``, are in
Docker's list too: they act on the calling process only (``migrate_pages`` and
``move_pages``, which act on others, are not allowed).

``socket`` is allowed only for the address families the runtime uses (:data:`SOCKET_FAMILIES`:
ipc and tcp sockets, netlink for the libraries that ask the kernel about interfaces); any other
family (AF_VSOCK, AF_PACKET, AF_BLUETOOTH ...) fails with EPERM.
"""

from __future__ import annotations

__all__ = ["ALLOWED", "SOCKET_FAMILIES", "profile", "check_traced", "ARCHITECTURES"]

SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}  # socket()'s first argument

ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}

ALLOWED = sorted(set("""
accept accept4 access adjtimex alarm arch_prctl bind brk capget capset chdir chmod chown chown32
clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range creat
dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2
epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2
fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32
fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat
fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64
futex_wait futex_waitv futex_wake futimesat get_mempolicy get_robust_list get_thread_area
getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32
getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority
getrandom getresgid getresgid32 getresuid getresuid32 getrlimit getrusage getsid getsockname
getsockopt gettid gettimeofday getuid getuid32 getxattr inotify_add_watch inotify_init
inotify_init1 inotify_rm_watch io_cancel io_destroy io_getevents io_pgetevents
io_pgetevents_time64 io_setup io_submit ioctl ioprio_get ioprio_set ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen
listxattr llistxattr lremovexattr lseek lsetxattr lstat lstat64 madvise map_shadow_stack mbind
membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall
mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64
mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock
munlockall munmap name_to_handle_at nanosleep newfstatat open openat openat2 pause pidfd_open
pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl
pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev
pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64
recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq
rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_get_priority_max
sched_get_priority_min sched_getaffinity sched_getattr sched_getparam sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop
semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto set_mempolicy
set_robust_list set_thread_area set_tid_address setfsgid setfsgid32 setfsuid setfsuid32
setgid setgid32 setgroups setgroups32 setitimer setpgid setpriority setregid setregid32
setresgid setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit setsid setsockopt
setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4
sigprocmask sigreturn socketcall socketpair splice stat stat64 statfs statfs64 statx
symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate
truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork
vmsplice wait4 waitid waitpid write writev
""".split()))


# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


def profile(arch: str) -> dict:
    """``linux.seccomp`` of config.json for ``arch`` (``uname -m`` name)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"no seccomp architectures for {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,  # EPERM
        "architectures": ARCHITECTURES[arch],
        "syscalls": [
            {"names": ALLOWED, "action": "SCMP_ACT_ALLOW"},
            # clone only without namespace flags (an unprivileged user namespace is an attack
            # surface); clone3 hides its flags in memory, so it answers ENOSYS and glibc falls
            # back to clone, as under Docker's profile.
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},  # ENOSYS
            # socket only for the families in SOCKET_FAMILIES (rules of one name are or-ed).
            *({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}]} for family in SOCKET_FAMILIES.values()),
        ],
    }


def check_traced(syscalls: set[str]) -> list[str]:
    """The traced syscalls the profile would refuse (empty when the boot fits)."""
    return sorted(syscalls - set(ALLOWED) - {"clone", "clone3", "socket"})
