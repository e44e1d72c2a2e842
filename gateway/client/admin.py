"""A client of the admin API (docs/admin-api.md): one method per endpoint the CLI uses.

Synchronous on purpose: a command makes a few requests in a row and sleeps
between polls of a job, nothing runs concurrently. Every failure is one of
two exceptions, which the CLI turns into a one-line message: :class:`ApiError`
when the API answered with its error envelope, :class:`Unreachable` when no
HTTP answer came at all.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import httpx

JSON = dict[str, Any]

DEFAULT_TIMEOUT = 30.0  # seconds; job actions answer at once (202), only waiting takes long


def client_tls(ca: Path | None) -> ssl.SSLContext:
    """A client context that verifies servers against ``ca`` (a PEM bundle),
    or the system's CAs when None."""
    return ssl.create_default_context(cafile=None if ca is None else str(ca))


class ApiError(Exception):
    """The API answered ``{"error": {"code", "message"}}`` with an HTTP error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unreachable(Exception):
    """No HTTP answer from the admin URL: nothing listens there, or it timed out."""

    def __init__(self, url: str, reason: str, *, refused: bool) -> None:
        super().__init__(reason)
        self.url = url
        self.reason = reason
        self.refused = refused


class AdminClient:
    """The admin API of one gateway, authenticated with its bearer token."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        ca: Path | None = None,
    ) -> None:
        """``ca``: the CA bundle an https ``url`` is verified with (else the system's)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        try:
            verify = client_tls(ca)
        except OSError as exc:  # ssl.SSLError too: not a PEM bundle
            raise Unreachable(self.url, f"cannot use the CA bundle {ca}: {exc}", refused=False) from None
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=verify,
            # The admin API listens on loopback unless configured otherwise; an
            # HTTP(S)_PROXY meant for the internet must not capture it.
            trust_env=False,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- state ---------------------------------------------------------------

    def tiers(self) -> JSON:
        return self._call("GET", "/tiers")

    def stats(self) -> JSON:
        return self._call("GET", "/stats")

    def object(self, bucket: str, key: str) -> JSON:
        return self._call("GET", f"/objects/{quote(bucket, safe='')}/{_key_path(key)}")

    # -- buckets -------------------------------------------------------------

    def buckets(self) -> JSON:
        return self._call("GET", "/buckets")

    def create_bucket(self, name: str, policy: JSON) -> JSON:
        return self._call("POST", "/buckets", json={"name": name, **policy})

    def bucket(self, name: str) -> JSON:
        return self._call("GET", f"/buckets/{quote(name, safe='')}")

    def update_bucket(self, name: str, policy: JSON) -> JSON:
        return self._call("PATCH", f"/buckets/{quote(name, safe='')}", json=policy)

    def delete_bucket(self, name: str) -> None:
        self._call("DELETE", f"/buckets/{quote(name, safe='')}")

    # -- pins ----------------------------------------------------------------

    def pins(self) -> JSON:
        return self._call("GET", "/pins")

    def unpin(self, bucket: str, prefix: str) -> None:
        self._call("DELETE", "/pins", params={"bucket": bucket, "prefix": prefix})

    # -- mounts --------------------------------------------------------------

    def mounts(self) -> JSON:
        return self._call("GET", "/mounts")

    def mount(self, name: str, source: str, options: JSON) -> JSON:
        return self._call("POST", "/mounts", json={"name": name, "source": source, **options})

    def unmount(self, name: str) -> None:
        self._call("DELETE", f"/mounts/{quote(name, safe='')}")

    # -- users and policies --------------------------------------------------

    def users(self) -> JSON:
        return self._call("GET", "/users")

    def user(self, name: str) -> JSON:
        return self._call("GET", f"/users/{quote(name, safe='')}")

    def create_user(self, name: str, policies: list[str], key: bool) -> JSON:
        return self._call("POST", "/users", json={"name": name, "policies": policies, "key": key})

    def update_user(self, name: str, change: JSON) -> JSON:
        return self._call("PATCH", f"/users/{quote(name, safe='')}", json=change)

    def delete_user(self, name: str) -> None:
        self._call("DELETE", f"/users/{quote(name, safe='')}")

    def attach(self, name: str, policy: str) -> JSON:
        return self._call("PUT", f"/users/{quote(name, safe='')}/policies/{quote(policy, safe='')}")

    def detach(self, name: str, policy: str) -> JSON:
        return self._call("DELETE", f"/users/{quote(name, safe='')}/policies/{quote(policy, safe='')}")

    def add_key(self, name: str) -> JSON:
        return self._call("POST", f"/users/{quote(name, safe='')}/keys")

    def rotate_key(self, name: str, access_key: str) -> JSON:
        return self._call("POST", f"/users/{quote(name, safe='')}/keys/{quote(access_key, safe='')}/rotate")

    def set_key(self, name: str, access_key: str, enabled: bool) -> JSON:
        return self._call("PATCH", f"/users/{quote(name, safe='')}/keys/{quote(access_key, safe='')}",
                          json={"enabled": enabled})

    def revoke_key(self, name: str, access_key: str) -> None:
        self._call("DELETE", f"/users/{quote(name, safe='')}/keys/{quote(access_key, safe='')}")

    def policies(self) -> JSON:
        return self._call("GET", "/policies")

    def policy(self, name: str) -> JSON:
        return self._call("GET", f"/policies/{quote(name, safe='')}")

    def put_policy(self, name: str, document: JSON) -> JSON:
        return self._call("PUT", f"/policies/{quote(name, safe='')}", json=document)

    def delete_policy(self, name: str) -> None:
        self._call("DELETE", f"/policies/{quote(name, safe='')}")

    # -- jobs ----------------------------------------------------------------

    def flush(self) -> JSON:
        return self._call("POST", "/jobs/flush")

    def compact(self, threshold: float | None) -> JSON:
        body = {} if threshold is None else {"threshold": threshold}
        return self._call("POST", "/jobs/compact", json=body)

    def evict(self, bucket: str | None, prefix: str) -> JSON:
        return self._call("POST", "/jobs/evict", json=_scope(bucket, prefix))

    def pin(self, bucket: str, prefix: str) -> JSON:
        return self._call("POST", "/jobs/pin", json=_scope(bucket, prefix))

    def warm(self, bucket: str, scope: JSON) -> JSON:
        """``scope``: {"prefix"} | {"keys"} | {"manifest"}, plus
        "concurrency" and "bandwidth" when given."""
        return self._call("POST", "/jobs/warm", json={"bucket": bucket, **scope})

    def register_epoch(self, body: JSON) -> JSON:
        return self._call("POST", "/epochs", json=body)

    def epochs(self) -> JSON:
        return self._call("GET", "/epochs")

    def epoch(self, epoch_id: str) -> JSON:
        return self._call("GET", f"/epochs/{quote(epoch_id, safe='')}")

    def end_epoch(self, epoch_id: str) -> JSON:
        return self._call("DELETE", f"/epochs/{quote(epoch_id, safe='')}")

    def jobs(self) -> JSON:
        return self._call("GET", "/jobs")

    def job(self, job_id: str) -> JSON:
        return self._call("GET", f"/jobs/{quote(job_id, safe='')}")

    def cancel_job(self, job_id: str) -> JSON:
        return self._call("POST", f"/jobs/{quote(job_id, safe='')}/cancel")

    # -- transport -----------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: JSON | None = None,
        params: dict[str, str] | None = None,
    ) -> JSON:
        """One request; the JSON object answered ({} for 204), or ApiError / Unreachable."""
        try:
            response = self._http.request(method, path, json=json, params=params)
        except httpx.ConnectError as exc:
            if (tls := _tls_failure(exc)) is not None:
                raise Unreachable(self.url, tls, refused=False) from exc
            raise Unreachable(self.url, str(exc), refused=True) from exc
        except httpx.TimeoutException as exc:
            reason = f"no answer within {self.timeout:g} s"
            raise Unreachable(self.url, reason, refused=False) from exc
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, str(exc) or type(exc).__name__, refused=False) from exc
        if response.status_code >= 400:
            raise _api_error(response)
        if response.status_code == 204 or not response.content:
            return {}
        return _json_object(response)


def _tls_failure(exc: BaseException) -> str | None:
    """Why the TLS handshake failed, if that is what ended the connection."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (f"TLS: certificate verify failed ({cause.verify_message or cause.reason}): point "
                    "TIERSTORE_TLS_CA at the CA bundle that signed the gateway's certificate")
        if isinstance(cause, ssl.SSLError):
            return f"TLS: {cause.reason or cause}"
        cause = cause.__cause__ or cause.__context__
    return None


def _scope(bucket: str | None, prefix: str) -> JSON:
    """The ``{"bucket", "prefix"}`` body of evict and pin, leaving out what is not given."""
    body: JSON = {}
    if bucket is not None:
        body["bucket"] = bucket
    if prefix:
        body["prefix"] = prefix
    return body


def _key_path(key: str) -> str:
    """Percent-encode an object key for the URL path, keeping its slashes.

    A ``.`` or ``..`` segment is encoded too: HTTP clients remove dot segments
    from paths (RFC 3986, section 5.2.4), which would name another key.
    """
    segments = quote(key, safe="/").split("/")
    return "/".join(s.replace(".", "%2E") if s in (".", "..") else s for s in segments)


def _api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json()["error"]
        return ApiError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        # Not the admin API's envelope: a proxy, or --admin-url names another server.
        reason = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        return ApiError(
            response.status_code,
            "UnexpectedAnswer",
            f"{reason} from {response.url}, not an admin API error: "
            "is the address the gateway's admin port?",
        )


def _json_object(response: httpx.Response) -> JSON:
    try:
        document = response.json()
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ApiError(
            response.status_code,
            "UnexpectedAnswer",
            f"{response.url} answered something other than a JSON object: "
            "is the address the gateway's admin port?",
        )
    return document
