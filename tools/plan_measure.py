#!/usr/bin/env python3
"""The memory plan beside the measured peak (issue 24): prints `ctitan plan` for a manifest,
runs the job with `ctitan launch`, and samples every process of it every 20 ms.

usage: tools/plan_measure.py [--bin build/bin/ctitan] MANIFEST [--section.key value ...]

Measured: per process the peak of its private resident memory (RssAnon + RssFile of
/proc/PID/status), plus the peak of the job's shared-memory segments in /dev/shm (their
allocated blocks), so shared pages count once; VmHWM (which counts the shared pages each
process touched again) is printed beside it. A process is named by its command line
(ctitan-stage --rank R --replica P, ...). The figures are compared with the plan's host rows.
"""
import os
import re
import subprocess
import sys
import time


def children_of(root):
    """Every descendant of pid root (the launch, its coordinator, every process of the job)."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
            kids.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError):
            pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def status(pid):
    v = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    v[k] = int(rest.split()[0]) * 1024
    except OSError:
        return None
    return v


def role(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            a = f.read().split(b"\0")
    except OSError:
        return None
    a = [x.decode(errors="replace") for x in a if x]
    if not a:
        return None
    exe = os.path.basename(a[0])
    if exe == "ctitan":
        return "launch/coordinator"
    name = exe.replace("ctitan-", "")
    opt = dict(zip(a[1::2], a[2::2])) if len(a) > 1 else {}
    if name == "stage":
        return f"stage {opt.get('--rank', '?')}.{opt.get('--replica', '?')}"
    if name == "optshard":
        return f"optshard {opt.get('--rank', '?')}"
    if name.startswith("loader"):
        return "loader"
    return name


def shm_bytes(job):
    n = 0
    for f in os.listdir("/dev/shm"):
        if f.startswith(f"ctitan.{job}."):
            try:
                n += os.stat(f"/dev/shm/{f}").st_blocks * 512
            except OSError:
                pass
    return n


def main():
    args = sys.argv[1:]
    ctitan = "build/bin/ctitan"
    if args[:1] == ["--bin"]:
        ctitan, args = args[1], args[2:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    plan = subprocess.run([ctitan, "plan"] + args, capture_output=True, text=True)
    print(plan.stdout, end="")
    if plan.returncode:
        print(plan.stderr, end="", file=sys.stderr)
        return 1
    job = re.search(r"^plan: job ([A-Za-z0-9_-]+)", plan.stdout, re.M).group(1)
    want = {}
    for line in plan.stdout.splitlines():  # "  WHO(16) host  columns... total" in MiB
        f = line[19:].split()
        if line.startswith("  ") and len(f) > 2 and f[0] == "host" and re.match(r"^[\d.]+$", f[-1]):
            want[line[2:18].strip()] = float(f[-1]) * (1 << 20)
    t0 = time.monotonic()
    p = subprocess.Popen([ctitan, "launch"] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, hwm, names, shm = {}, {}, {}, 0
    while p.poll() is None:
        for c in children_of(p.pid) + [p.pid]:
            s = status(c)
            if not s:
                continue
            if c not in names:
                names[c] = "launcher" if c == p.pid else role(c)
            priv = s.get("RssAnon", 0) + s.get("RssFile", 0)
            peak[c] = max(peak.get(c, 0), priv)
            hwm[c] = max(hwm.get(c, 0), s.get("VmHWM", 0))
        shm = max(shm, shm_bytes(job))
        time.sleep(0.02)
    err = p.stderr.read()
    secs = time.monotonic() - t0
    if p.returncode:
        print(err, end="", file=sys.stderr)
        print(f"measure: the launch exited {p.returncode}", file=sys.stderr)
        return 1
    got = {}
    for c, v in peak.items():
        r = names.get(c) or "?"
        if r == "launch/coordinator":  # the launcher's child: the coordinator
            r = "coordinator"
        got[r] = got.get(r, 0) + v
    mib = 1 << 20
    print(f"\nmeasured ({secs:.1f} s run; private = peak RssAnon + RssFile per process, summed per row):")
    print(f"  {'process':<22}{'plan MiB':>10}{'measured MiB':>14}{'plan/measured':>15}")
    total_plan = total_got = 0
    for r in sorted(set(want) | set(got)):
        if r == "shared memory":
            continue
        w, g = want.get(r, 0), got.get(r, 0)
        total_plan += w
        total_got += g
        ratio = f"{w / g:.3f}" if g else "-"
        print(f"  {r:<22}{w / mib:>10.1f}{g / mib:>14.1f}{ratio:>15}")
    w = want.get("shared memory", 0)
    print(f"  {'shared memory':<22}{w / mib:>10.1f}{shm / mib:>14.1f}{(w / shm if shm else 0):>15.3f}")
    total_plan += w
    total_got += shm
    print(f"  {'host total':<22}{total_plan / mib:>10.1f}{total_got / mib:>14.1f}{total_plan / total_got:>15.3f}")
    print(f"  (sum of VmHWM, shared pages counted once per process that touched them: "
          f"{sum(hwm.values()) / mib:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
