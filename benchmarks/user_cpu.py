"""What a policy costs a hot GET: the same GETs signed by root and by a
user with policies, on one gateway, rounds alternating.

Starts one gateway (embedded capacity directory, ``--workers`` as given),
writes ``--objects`` objects of ``--size`` bytes and reads them once (hot),
creates a user whose access is decided by policies (a ready-made
``read-only:<bucket>``, a named policy with a Deny on another prefix and an
Allow under an ``s3:prefix`` condition, and a bucket policy naming the
user), then runs ``--rounds`` rounds: in each, root's key and the user's
key each serve ``--gets`` GETs of random keys from ``--threads`` threads
(the order swaps every round). Per round and caller: GETs/s and the
gateway's CPU per GET (user + system of the gateway process and its read
workers, from /proc). Reported: the medians, and user / root. The target
(issue 37): at most 1.1x.

Run:  .venv/bin/python benchmarks/user_cpu.py [--rounds 10] [--gets 3000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import _common  # first: puts the repo root on sys.path
import ab
from _common import REGION, gateway, machine, table, temp_dir
from _compare_client import _Target
from ab import BUCKET, fill

from tests.integration.oracle import RawReader
from tests.servers import Gateway


def hot_round(gw: Gateway, key: tuple[str, str], gets: int, threads: int, objects: int) -> tuple[float, float]:
    """(GETs per second, gateway CPU microseconds per GET) of one round of
    GETs signed with ``key`` (access key, secret): ``ab.hot_round``'s."""
    return ab.hot_round(gw, gets, threads, objects, reader=lambda: RawReader(
        _Target(gw.port), region=REGION, access_key=key[0], secret_key=key[1]))  # type: ignore[arg-type]


def make_user(gw: Gateway) -> tuple[str, str]:
    """A user whose every GET is decided by several policies, none of them root's shortcut."""
    gw.admin("PUT", "/policies/bench-team", json={"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "s3:*", "Resource": f"arn:aws:s3:::{BUCKET}/private/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{BUCKET}",
         "Condition": {"StringLike": {"s3:prefix": ["k*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectTagging"],
         "Resource": [f"arn:aws:s3:::{BUCKET}/k*", f"arn:aws:s3:::{BUCKET}/x?/*"]},
    ]})
    created = gw.admin("POST", "/users", json={"name": "bench-user",
                                               "policies": [f"read-only:{BUCKET}", "bench-team"]}).json()
    policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::000000000000:user/bench-user"},
                             "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"}]}
    signer = RawReader(_Target(gw.port), region=REGION)  # type: ignore[arg-type]
    status, _, body = signer.request("PUT", BUCKET, "", json.dumps(policy).encode(), query="policy")
    assert status == 204, body
    return created["key"]["access_key"], created["key"]["secret_key"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--gets", type=int, default=3000, help="GETs per round and caller")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1, help="the gateway's --workers (1)")
    ap.add_argument("--json", type=_common.Path, help="write every number here")
    args = ap.parse_args(argv)
    _common.begin()
    results: dict[str, list[tuple[float, float]]] = {"root": [], "user": []}
    with temp_dir("user-cpu") as tmp, gateway(tmp / "gw", extra_args=("--workers", str(args.workers))) as gw:
        fill(gw, args.objects, args.size)
        callers = {"root": (_common.ACCESS_KEY, _common.SECRET_KEY), "user": make_user(gw)}
        for round_ in range(args.rounds):
            order = ["root", "user"] if round_ % 2 == 0 else ["user", "root"]
            for name in order:
                results[name].append(hot_round(gw, callers[name], args.gets, args.threads, args.objects))
    rate = {name: statistics.median(r for r, _ in rounds) for name, rounds in results.items()}
    cpu = {name: statistics.median(c for _, c in rounds) for name, rounds in results.items()}
    rows = [[name, f"{rate[name]:,.0f}", f"{cpu[name]:,.0f}",
             f"{min(c for _, c in results[name]):,.0f}-{max(c for _, c in results[name]):,.0f}"]
            for name in results]
    print(machine())
    print(f"hot GETs of {args.size:,}-byte objects, {args.threads} threads, {args.rounds} alternating rounds of "
          f"{args.gets:,} GETs per caller, --workers {args.workers}")
    print(table(["signed by", "GETs/s (median)", "CPU us/GET (median)", "CPU us/GET (range)"], rows))
    ratio = cpu["user"] / cpu["root"]
    print(f"user / root: {rate['user'] / rate['root']:.2f}x GETs/s, {ratio:.2f}x CPU per GET (target: at most 1.10x)")
    if args.json:
        _common.write_results(args, {"rounds": results, "cpu_ratio": ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())
