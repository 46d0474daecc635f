"""Which transport NCCL used between nodes, read from its own ``NCCL_DEBUG=INFO`` log lines.

    python -m trainer.nccl_transport run.log --expect efa --require-gdr --min-busbw-gb-per-s 360

The readiness job (workloads/readiness.py) tees the 2-node all-reduce's output to a file and runs
this on it. NCCL prints, per rank (aws-ofi-nccl with EFA; lines quoted in tests/trainer/
test_nccl_transport.py from NVIDIA/nccl and aws/aws-ofi-nccl issues):

- ``NCCL INFO Using network Libfabric`` (NCCL >= 2.19 with aws-ofi-nccl; older: ``AWS Libfabric``),
  or ``Using network Socket`` when NCCL fell back to TCP;
- ``NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)``: libfabric's provider;
- ``Channel 00/0 : 7[7] -> 15[7] [send] via NET/Libfabric/0/GDRDMA``: a channel crossing nodes,
  ``/GDRDMA`` when the NIC reads and writes GPU memory directly (GPUDirect RDMA).

Exit 0 when every inter-node channel runs over libfabric's EFA provider (with GDRDMA where
required) and, if the log carries ``trainer.nccl_check``'s result line, its bus bandwidth reaches
the floor; 1 otherwise, with every reason. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import NamedTuple, Optional, Sequence

NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w+)")
NET_CHANNEL = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? ?: .* via NET/([^/\s]+(?: [^/\s]+)*)/(\d+)(/GDRDMA)?")


class Transport(NamedTuple):
    networks: tuple[str, ...]
    providers: tuple[str, ...]
    net_channels: int
    gdr_channels: int
    channel_networks: tuple[str, ...]
    busbw_gb_per_s: Optional[float]


def parse_log(text: str) -> Transport:
    networks, providers, channel_networks = set(), set(), set()
    net_channels = gdr = 0
    busbw = None
    for line in text.splitlines():
        if m := NETWORK.search(line):
            networks.add(m.group(1))
        if m := PROVIDER.search(line):
            providers.add(m.group(1))
        if m := NET_CHANNEL.search(line):
            net_channels += 1
            channel_networks.add(m.group(1))
            gdr += bool(m.group(3))
        if line.startswith("{") and '"busbw_gb_per_s"' in line:
            busbw = float(json.loads(line)["busbw_gb_per_s"])
    return Transport(tuple(sorted(networks)), tuple(sorted(providers)), net_channels, gdr,
                     tuple(sorted(channel_networks)), busbw)


def problems(t: Transport, *, expect_efa: bool, require_gdr: bool, min_busbw_gb_per_s: Optional[float]) -> list[str]:
    out = []
    if expect_efa:
        if not t.networks:
            out.append("no 'NCCL INFO Using network' line: run with NCCL_DEBUG=INFO")
        elif any("Libfabric" not in n for n in t.networks):
            out.append(f"NCCL used network {', '.join(t.networks)}, not Libfabric (aws-ofi-nccl): TCP fallback; "
                       "check the pod requests vpc.amazonaws.com/efa and the image ships aws-ofi-nccl")
        if "efa" not in t.providers:
            out.append(f"libfabric provider is {', '.join(t.providers) or 'not reported'}, not efa")
        if t.net_channels == 0:
            out.append("no inter-node channel ('via NET/...'): did the job span two nodes?")
        elif any("Libfabric" not in n for n in t.channel_networks):
            out.append(f"inter-node channels run over {', '.join(t.channel_networks)}")
        if require_gdr and t.gdr_channels < t.net_channels:
            out.append(f"{t.net_channels - t.gdr_channels} of {t.net_channels} inter-node channels lack GPUDirect RDMA "
                       "(no /GDRDMA): check FI_EFA_USE_DEVICE_RDMA=1 and the driver's peer-memory support")
    if min_busbw_gb_per_s is not None and t.busbw_gb_per_s is not None and t.busbw_gb_per_s < min_busbw_gb_per_s:
        out.append(f"all-reduce bus bandwidth {t.busbw_gb_per_s:.1f} GB/s is below the floor {min_busbw_gb_per_s:g} GB/s")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.nccl_transport")
    parser.add_argument("log")
    parser.add_argument("--expect", choices=("efa", "any"), default="efa")
    parser.add_argument("--require-gdr", action="store_true")
    parser.add_argument("--min-busbw-gb-per-s", type=float)
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        transport = parse_log(f.read())
    found = problems(transport, expect_efa=args.expect == "efa", require_gdr=args.require_gdr,
                     min_busbw_gb_per_s=args.min_busbw_gb_per_s)
    print(json.dumps({"transport": transport._asdict(), "ok": not found, "problems": found}), flush=True)
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
