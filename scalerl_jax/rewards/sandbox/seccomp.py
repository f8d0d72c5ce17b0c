"""The sandbox's seccomp filter: a classic BPF program for `bwrap --seccomp`.

It denies (EPERM) the system calls through which one process reaches into
another of the same user (ptrace, process_vm_*, pidfd_getfd, kcmp), the
stores that outlive a process (SysV IPC, POSIX message queues, keyrings),
and mount and namespace changes; every other call is allowed. A call from
another ABI (x32, or i386 on x86-64) kills the process. Built by hand, not
with libseccomp, so the sandbox needs nothing beyond the bwrap binary.
Design: docs/design/sandbox.md.
"""

from __future__ import annotations

import platform
import struct
from typing import Optional

# Denied calls: name -> (x86-64 number, aarch64 / asm-generic number), from
# the kernel's unistd headers.
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "shmget": (29, 194),
    "shmctl": (31, 195),
    "shmat": (30, 196),
    "shmdt": (67, 197),
    "semget": (64, 190),
    "semctl": (66, 191),
    "semtimedop": (220, 192),
    "semop": (65, 193),
    "msgget": (68, 186),
    "msgctl": (71, 187),
    "msgrcv": (70, 188),
    "msgsnd": (69, 189),
    "mq_open": (240, 180),
    "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184),
    "mq_getsetattr": (245, 185),
    "perf_event_open": (298, 241),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
}
# AUDIT_ARCH_* of the supported machines, and which column of DENIED.
_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
_X32_BIT = 0x40000000  # x86-64's x32 ABI: the same table with this bit set.

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
# Offsets in struct seccomp_data.
_NR, _ARCH = 0, 4


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
  return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: Optional[str] = None) -> Optional[bytes]:
  """The filter for `machine` (default: this one); None where unsupported."""
  arch = _ARCHES.get(machine or platform.machine())
  if arch is None:
    return None
  audit_arch, column = arch
  numbers = sorted({numbers[column] for numbers in DENIED.values()})
  insns = [
      _insn(_LD_W_ABS, _ARCH),
      _insn(_JEQ_K, audit_arch, jt=1),
      _insn(_RET_K, _RET_KILL_PROCESS),
      _insn(_LD_W_ABS, _NR),
  ]
  if column == 0:
    insns += [_insn(_JGE_K, _X32_BIT, jf=1), _insn(_RET_K, _RET_KILL_PROCESS)]
  # Each match jumps over the remaining comparisons and the ALLOW to EPERM.
  for i, number in enumerate(numbers):
    insns.append(_insn(_JEQ_K, number, jt=len(numbers) - i))
  insns += [_insn(_RET_K, _RET_ALLOW), _insn(_RET_K, _RET_EPERM)]
  return b"".join(insns)
