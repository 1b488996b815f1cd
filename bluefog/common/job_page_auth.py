"""The job page's credentials: a per-job secret in a 0600 file, checked by HTTP Digest.

Browsers answer a Digest challenge with a hash of the secret, the server's nonce and the
request, so the secret itself never crosses the connection. Prometheus speaks no Digest: it
may send the secret as a bearer token (its ``authorization.credentials_file``), accepted only
on a loopback connection, where it crosses no network. The secret is never printed and never
passed on a command line: the job prints the file's path.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from typing import Dict, Optional

USER = "bluefog"
REALM = "bluefog job page"
NONCE_LIFETIME_S = 3600.0
_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def default_secret_path(port: int) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bluefog", f"job-page-{port}.secret")


def load_or_create_secret(path: str) -> str:
    """The secret in ``path``; a new random one written there (mode 0600, folder 0700) when
    the file does not exist. Refuses a file that others can read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        secret = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        return secret
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"bluefog job page: the secret file {path} can be read by others "
                              f"(mode {oct(st.st_mode & 0o777)}); run `chmod 600 {path}`")
    with open(path) as f:
        secret = f.read().strip()
    if len(secret) < 16:
        raise ValueError(f"bluefog job page: the secret in {path} is shorter than 16 characters; "
                         f"write a longer one or delete the file for a new random one")
    return secret


def _same(a: str, b: str) -> bool:
    """Constant-time equality of any two strings (a stranger's may hold any character)."""
    return hmac.compare_digest(a.encode("utf-8", "replace"), b.encode("utf-8", "replace"))


def _h(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


class DigestAuth:
    """Checks Authorization headers against one user and secret (RFC 7616, MD5, qop=auth:
    what every browser answers). Nonces are stateless: a time and its HMAC."""

    def __init__(self, secret: str):
        self._secret = secret
        self._ha1 = _h(f"{USER}:{REALM}:{secret}")
        self._key = secrets.token_bytes(32)

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def challenge(self, stale: bool = False) -> str:
        stamp = f"{time.time():.3f}"
        nonce = f"{stamp}-{self._sign(stamp)}"
        return (f'Digest realm="{REALM}", qop="auth", algorithm=MD5, nonce="{nonce}"'
                + (", stale=true" if stale else ""))

    def _fresh(self, nonce: str) -> bool:
        stamp, _, mac = nonce.partition("-")
        try:
            age = time.time() - float(stamp)
        except ValueError:
            return False
        return _same(mac, self._sign(stamp)) and 0 <= age < NONCE_LIFETIME_S

    def check(self, header: Optional[str], method: str, path: str,
              loopback: bool) -> Optional[bool]:
        """True: accepted; False: refused; None: a valid answer to an expired nonce (send a
        stale challenge). The answer must be for ``path``. A bearer token is accepted only
        when ``loopback``."""
        if not header:
            return False
        scheme, _, rest = header.strip().partition(" ")
        if scheme.lower() == "bearer":
            return loopback and _same(rest.strip(), self._secret)
        if scheme.lower() != "digest" or len(rest) > 4096:
            return False
        p: Dict[str, str] = {m.group(1).lower(): m.group(2) if m.group(2) is not None
                             else m.group(3) for m in _PARAM.finditer(rest)}
        need = ("username", "realm", "nonce", "uri", "response", "nc", "cnonce", "qop")
        if any(k not in p for k in need) or p["username"] != USER or p["qop"] != "auth" \
                or p["uri"] != path:
            return False
        if p.get("algorithm", "MD5").upper() != "MD5":
            return False
        ha2 = _h(f"{method}:{p['uri']}")
        want = _h(f"{self._ha1}:{p['nonce']}:{p['nc']}:{p['cnonce']}:auth:{ha2}")
        if not _same(want, p["response"]):
            return False
        return True if self._fresh(p["nonce"]) else None
