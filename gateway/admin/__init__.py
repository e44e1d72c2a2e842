"""The admin REST API (FastAPI), served on its own port next to the S3 port.

``GET /health`` and ``GET /ready`` are open so load balancers and
orchestrators can probe them; everything else requires
``Authorization: Bearer <admin token>``. The OpenAPI schema and docs pages
stay open: they describe the API, they expose no data. docs/admin-api.md
lists every route; a test keeps the two in step.

May import: ``client``, ``config``, ``observability``, ``s3``, ``storage``
(peer clients for cooperative jobs) and ``version``; tiering's service.
"""

from gateway.admin.app import build_admin_app
from gateway.admin.context import NodeStatus

__all__ = ["NodeStatus", "build_admin_app"]
