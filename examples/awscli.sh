#!/usr/bin/env bash
# The AWS CLI against a tierstore gateway: make a bucket, copy a file up,
# sync a folder up and back down, list it, and compare the two folders.
#
#   eval "$(tierstore env)"
#   examples/awscli.sh [bucket]        # default bucket: recipes-awscli
#
# The CLI (v1 and v2 releases since autumn 2023) reads AWS_ENDPOINT_URL and
# the key pair from the environment, so no command needs --endpoint-url.
set -euo pipefail

bucket=${1:-recipes-awscli}
: "${AWS_ENDPOINT_URL:?is not set: run  eval \"\$(tierstore env)\"  first}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAILED: $*" >&2; exit 1; }

# A data set: 12 small samples, their labels, and one file above the CLI's
# 8 MiB multipart threshold.
mkdir -p "$work/up/samples" "$work/up/labels"
for i in $(seq -w 1 12); do
    head -c $((4096 * 10#$i)) /dev/urandom >"$work/up/samples/$i.bin"
    echo "class-$((10#$i % 3))" >"$work/up/labels/$i.txt"
done
head -c $((9 * 1024 * 1024)) /dev/urandom >"$work/up/big.bin"

# A second run finds the bucket there: BucketAlreadyOwnedByYou is fine.
aws s3 mb "s3://$bucket" 2>"$work/mb.err" || grep -q BucketAlreadyOwnedByYou "$work/mb.err" \
    || fail "aws s3 mb: $(cat "$work/mb.err")"

aws s3 cp --only-show-errors "$work/up/big.bin" "s3://$bucket/data/big.bin"
aws s3 sync --only-show-errors "$work/up" "s3://$bucket/data"  # all but big.bin, which is there
echo "uploaded $(find "$work/up" -type f | wc -l) files to s3://$bucket/data at $AWS_ENDPOINT_URL"

listed=$(aws s3 ls --recursive "s3://$bucket/data/" | wc -l)
[ "$listed" -eq 25 ] || fail "aws s3 ls --recursive listed $listed objects, not 25"
echo "aws s3 ls --recursive: $listed objects"

aws s3 sync --only-show-errors "s3://$bucket/data" "$work/down"
diff -r "$work/up" "$work/down" >/dev/null || fail "the folder synced back down differs: $(diff -rq "$work/up" "$work/down")"

# sync compares sizes and modification times: a second sync has nothing to do.
again=$(aws s3 sync --dryrun "$work/up" "s3://$bucket/data" | wc -l)
[ "$again" -eq 0 ] || fail "a second sync up would copy $again files again"
echo "synced back down: identical; a second sync copies nothing"
echo "OK: awscli verified $listed objects"
