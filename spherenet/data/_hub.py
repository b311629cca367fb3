"""Reaching the Hugging Face Hub without hanging on a machine that has no network.

``huggingface_hub`` retries a failed request five times with back-off (about 25 s in all) before
giving up. Before any Hub request, :func:`hub_unreachable` opens one TCP connection to the
endpoint (or to the configured proxy) with a short timeout, so that a machine without network
gets a clear error in a second instead.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
import urllib.request

__all__ = ["hub_endpoint", "hub_offline", "hub_unreachable"]

_TRUE = {"1", "true", "yes", "on"}


def hub_endpoint() -> str:
    """The Hub address that ``huggingface_hub`` will use (``HF_ENDPOINT`` or huggingface.co)."""
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except Exception:  # pragma: no cover - huggingface_hub is a dependency of datasets
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_offline() -> bool:
    """True when the user asked for offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except Exception:  # pragma: no cover
        pass
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _target(endpoint: str) -> tuple[str, int, str]:
    """(host, port, label) of the first hop towards ``endpoint``: the proxy when one is set."""
    url = urllib.parse.urlsplit(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if p.hostname:
            return p.hostname, p.port or 80, f"proxy {p.hostname}:{p.port or 80}"
    return host, port, f"{host}:{port}"


def hub_unreachable(timeout: float = 5.0, endpoint: str | None = None) -> str | None:
    """None when a TCP connection to the Hub (or its proxy) opens within ``timeout`` seconds.

    Otherwise a short reason, e.g. ``"huggingface.co:443: [Errno -2] Name or service not
    known"``. Name resolution has no timeout of its own, so the attempt runs in a daemon thread.
    """
    host, port, label = _target(endpoint or hub_endpoint())
    result: list[str | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(None)
        except OSError as exc:
            result.append(f"{label}: {exc}")

    thread = threading.Thread(target=attempt, name="spherenet-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        return f"{label}: no answer within {timeout:g} s"
    return result[0]
