"""A seccomp filter for the sandbox: the system calls untrusted code never needs, refused with EPERM.

Key insight: bubblewrap loads a *compiled* classic-BPF program from a file descriptor (``bwrap --seccomp FD``)
right before it execs the command, so the filter needs no library: it is a few dozen 8-byte instructions
(``struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}``) over ``struct seccomp_data {int nr; u32 arch;
u64 ip; u64 args[6]}``, written here with ``struct``:

    ld  [arch]            ; jeq AUDIT_ARCH_<this machine> ? next : KILL   (a foreign ABI, e.g. int 0x80)
    ld  [nr]              ; (x86_64) jge 0x40000000 ? KILL : next         (the x32 ABI)
    jeq ptrace  ? ERRNO(EPERM) : next      ... one pair per refused call
    jeq clone   ? (args[0] & CLONE_NEW* ? ERRNO(EPERM) : ALLOW) : next    (no new namespaces)
    jeq clone3  ? ERRNO(ENOSYS) : next     (its flags live in memory BPF cannot read; libc falls back to clone)
    ret ALLOW

Refused (EPERM): debugging and reading other processes (ptrace, process_vm_readv/writev), mounts and
namespaces (mount, umount2, the new mount API, pivot_root, chroot, unshare, setns, clone with a CLONE_NEW*
flag), kernel keys (keyctl, add_key, request_key), bpf, perf_event_open, userfaultfd, io_uring, kernel
modules and kexec, reboot, swapon/swapoff, acct, quotactl, syslog, open_by_handle_at / name_to_handle_at,
personality, vhangup, iopl/ioperm. Everything else is allowed: this is a short deny list against the usual
kernel attack surface, not an allow list; it does not stop a kernel bug reachable through an allowed call.

Machines: x86_64 and aarch64 (``filter_bytes()`` returns None elsewhere and the sandbox runs without one).
Numbers are from the kernel's ``asm/unistd_64.h`` (x86_64) and ``asm-generic/unistd.h`` (aarch64);
tests/rewards/test_sandbox.py checks them against those headers where they are installed.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits on little endian)

X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

REFUSED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "open_by_handle_at",
    "name_to_handle_at",
    "personality",
    "vhangup",
    "iopl",
    "ioperm",
)

# fmt: off
SYSCALLS = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250,
        "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169,
        "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "syslog": 103, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "personality": 135, "vhangup": 153, "iopl": 172, "ioperm": 173,
        "clone": 56, "clone3": 435,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "keyctl": 219,
        "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60, "syslog": 116, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "personality": 92, "vhangup": 58, "clone": 220, "clone3": 435,
    },
}
# fmt: on
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # EM_X86_64 / EM_AARCH64 | 64BIT | LE
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def machine() -> str:
    m = platform.machine().lower()
    return _MACHINE_ALIASES.get(m, m)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(arch: str) -> bytes:
    """The filter program for ``arch`` ("x86_64" or "aarch64") as bytes for ``bwrap --seccomp FD``.

    Example: for x86_64 the program starts ``ld [4]; jeq 0xC000003E, 1, 0; ret KILL_PROCESS; ld [0]; ...``
    and a call of ptrace (101) meets ``jeq 101, 0, 1`` then ``ret ERRNO|EPERM``.
    """
    nrs = SYSCALLS[arch]
    prog = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, AUDIT_ARCH[arch], jt=1, jf=0),
        _insn(_RET_K, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if arch == "x86_64":  # x32 calls share AUDIT_ARCH_X86_64 and set this bit in nr
        prog += [_insn(_JGE_K, X32_SYSCALL_BIT, jt=0, jf=1), _insn(_RET_K, RET_KILL_PROCESS)]
    for name in REFUSED:
        if name in nrs:
            prog += [_insn(_JEQ_K, nrs[name], jt=0, jf=1), _insn(_RET_K, RET_ERRNO | errno.EPERM)]
    prog += [_insn(_JEQ_K, nrs["clone3"], jt=0, jf=1), _insn(_RET_K, RET_ERRNO | errno.ENOSYS)]
    prog += [
        _insn(_JEQ_K, nrs["clone"], jt=0, jf=3),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JSET_K, CLONE_NEW_FLAGS, jt=0, jf=1),
        _insn(_RET_K, RET_ERRNO | errno.EPERM),
        _insn(_RET_K, RET_ALLOW),
    ]
    return b"".join(prog)


def filter_bytes() -> bytes | None:
    """This machine's filter, or None on a machine we have no syscall table for."""
    arch = machine()
    return build_filter(arch) if arch in SYSCALLS else None


def filter_fd() -> int | None:
    """A readable fd holding this machine's filter (the caller passes it to bwrap and closes it), or None."""
    prog = filter_bytes()
    if prog is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: far below the pipe buffer
    finally:
        os.close(w)
    return r
