"""Notices from the other gateways of a cluster (``tiering/cluster/push.py``).

``POST /?peer-news=segments`` (a writer committed segments) or
``=identity`` (users, keys or policies changed), no body, signed with the
cluster's key pair: the operation is not in the table of IAM actions
(``gateway/auth/access.py``), so only root may send it. The node follows
soon, one round for the notices of a moment; the answer (204) goes out at
once, before anything is read.
"""

from __future__ import annotations

from gateway.handlers.context import Context
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request
from tiering.cluster.push import NEWS


async def post_news(ctx: Context, req: S3Request) -> Response:
    what = req.query.get(NEWS, "")
    if ctx.news is None or not ctx.news(what):
        raise S3Error("InvalidArgument", f"This gateway follows no news {what!r}",
                      ArgumentName=NEWS, ArgumentValue=what)
    return Response(status=204)
