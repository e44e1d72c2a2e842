"""pyarrow against a tierstore gateway: write a Parquet data set partitioned
by a column (several files per partition) through ``pyarrow.fs.S3FileSystem``,
then read it back with ``pyarrow.dataset``: a filter on the partition column
skips whole files, a filter on a column skips row groups by their statistics,
and a projection reads only the columns asked for, all with ranged GETs.
Row counts and the rows themselves are checked.

    eval "$(tierstore env)"
    python examples/pyarrow_parquet.py --bucket recipes-arrow

``S3FileSystem()`` does NOT read AWS_ENDPOINT_URL (only ``FileSystem.from_uri``
and bare ``s3://`` paths do), so the endpoint is passed as
``endpoint_override``; the key pair comes from the environment.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyarrow import fs

from _recipe import arguments, check, endpoint, region

ROWS, LABELS = 6000, 4


def make_table(rows: int) -> pa.Table:
    """Rows whose values follow from their id, so any row can be checked."""
    return pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "label": pa.array([i % LABELS for i in range(rows)], pa.int32()),
        "score": [i * 7919 % 1000 / 1000 for i in range(rows)],
        "caption": [f"sample {i}" for i in range(rows)],
    })


def s3_filesystem() -> fs.S3FileSystem:
    return fs.S3FileSystem(endpoint_override=endpoint(), region=region(),
                           allow_bucket_creation=True)


def write(s3: fs.S3FileSystem, table: pa.Table, root: str) -> list[str]:
    written: list[str] = []
    ds.write_dataset(
        table, root, filesystem=s3, format="parquet",
        partitioning=ds.partitioning(pa.schema([("label", pa.int32())]), flavor="hive"),
        max_rows_per_file=500, max_rows_per_group=100,  # small files and row groups, to skip some
        existing_data_behavior="delete_matching",
        file_visitor=lambda f: written.append(f.path),
    )
    return written


def main() -> None:
    args = arguments(__doc__, "recipes-arrow")
    s3 = s3_filesystem()
    s3.create_dir(args.bucket)
    table = make_table(ROWS)
    root = f"{args.bucket}/scores"
    files = write(s3, table, root)
    infos = s3.get_file_info(fs.FileSelector(root, recursive=True))
    listed = [i.path for i in infos if i.type == fs.FileType.File]
    check(sorted(listed) == sorted(files), f"listing under {root}: {listed}, wrote {files}")
    print(f"wrote {ROWS} rows as {len(files)} Parquet files in {LABELS} partitions to s3://{root}")

    dataset = ds.dataset(root, filesystem=s3, format="parquet", partitioning="hive")
    rows = dataset.count_rows()
    check(rows == ROWS, f"the data set holds {rows} rows, wrote {ROWS}")

    wanted = (ds.field("label") == 3) & (ds.field("id") >= 4000)
    got = dataset.to_table(columns=["id", "score"], filter=wanted).sort_by("id")
    want = table.filter(pc.and_(pc.equal(table["label"], 3), pc.greater_equal(table["id"], 4000)))
    want = want.select(["id", "score"]).sort_by("id")
    check(got.equals(want), f"filtered read: {got.num_rows} rows, expected {want.num_rows} "
          "(or the same number with other values)")
    total = pc.sum(got["score"]).as_py()
    print(f"filter + projection read {got.num_rows} rows x {got.num_columns} columns, "
          f"sum(score) {total:.3f}")

    whole = dataset.to_table().sort_by("id")
    check(whole.select(["id", "score", "caption"]).equals(table.select(["id", "score", "caption"])),
          "the whole data set read back differs from what was written")
    print(f"OK: pyarrow verified {whole.num_rows} rows in {len(files)} files")


if __name__ == "__main__":
    main()
