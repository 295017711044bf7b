"""Who may call the control plane, and as what (docs/security.md, "The control plane").

Every call to AdapterService and TrainingService carries ``authorization: Bearer <token>`` metadata. The token is
one of:

- an entry of the control plane's token file (``control.tokens_file``) or variable (``control.tokens_env``):
  ``identity:role=token`` per line. The file is checked for a change at most every ``control.reload_s`` seconds and
  re-read when its modification time, size or inode changed (a Kubernetes Secret mounted as a directory is replaced
  through a symlink swap, which changes the inode), so a token removed from it is refused within that time without
  a restart. A file that no longer parses refuses every file token (fail closed) until it is fixed, and says so in
  the log and to the caller;
- the legacy single admin token (``adapters.admin_token_env`` / ``admin_token_file``): identity ``admin-token``, role
  ``admin``;
- a JWT (``control.jwt``): signature checked against the JWKS with PyJWT, ``iss``, ``aud`` and ``exp`` required and
  checked; role from the claim ``role_claim``, identity from ``identity_claim``.

Roles are ordered ``viewer`` < ``operator`` < ``admin``; a method needs a minimum role (:data:`METHOD_ROLES`). Tokens
are kept only as SHA-256 digests and never logged or echoed. Errors: no or malformed metadata, an unknown token, a
JWT that fails verification -> UNAUTHENTICATED; a known identity whose role is too low -> PERMISSION_DENIED; no
identity configured at all -> PERMISSION_DENIED naming the settings.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mascot.core.errors import PermissionDenied, Unauthenticated, Unavailable
from mascot.gateway.security import _digest, bearer, token_entries

log = logging.getLogger(__name__)

#: The roles, lowest first: each may do what the ones before it may.
ROLES = ("viewer", "operator", "admin")
_RANK = {r: i for i, r in enumerate(ROLES)}
IDENTITY_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
#: The identity of the legacy admin token (``adapters.admin_token_*``).
LEGACY_IDENTITY = "admin-token"

#: The least role of each control-plane method; a method not listed needs ``admin``.
METHOD_ROLES: dict[str, str] = {
    "ListAdapters": "viewer", "ListAuditEvents": "viewer", "GetRun": "viewer", "ListRuns": "viewer",
    "PublishAdapter": "operator", "PromoteAdapter": "operator", "RollbackAdapter": "operator",
    "RetireAdapter": "operator", "TriggerRetraining": "operator", "CancelRun": "operator",
    # promoting past the evaluation gate (PromoteAdapter with skip_eval_gate) needs admin: see AdapterServicer
}


@dataclass(frozen=True)
class Identity:
    """An authenticated caller of the control plane.

    Attributes:
        name: Who called (token identity or the JWT's identity claim), recorded in the audit trail.
        role: ``viewer``, ``operator`` or ``admin``.
        via: ``token``, ``legacy-token`` or ``jwt``.
    """

    name: str
    role: str
    via: str = "token"

    def allows(self, role: str) -> bool:
        """True when this identity's role is ``role`` or above."""
        return _RANK[self.role] >= _RANK[role]


def parse_control_tokens(text: str, source: str) -> dict[bytes, Identity]:
    """Parse ``identity:role=token`` entries (one per line or comma-separated; ``#`` starts a comment line).

    Returns:
        SHA-256 digest of each token -> :class:`Identity`.

    Raises:
        ValueError: a malformed entry, a bad identity, an unknown role, a token shorter than 16 characters or with
            spaces, or a token given twice. Messages name the entry's position and identity, never a token.
    """
    def identity(who: str) -> str:
        name, _, role = (x.strip() for x in who.partition(":"))
        if not IDENTITY_RE.match(name):
            return ""
        if role not in _RANK:
            raise ValueError(f"{source}: {name!r} has role {role[:20]!r}; use one of {', '.join(ROLES)}")
        return repr(name)

    entries = token_entries(text, source, "identity:role=token with an identity of letters, digits and '_ . @ -' "
                                          "(at most 64)", identity)
    return {d: Identity(*(x.strip() for x in who.partition(":")[::2])) for d, (who, _) in entries.items()}


class WatchedFile:
    """A file re-read when it changes, checked at most every ``reload_s`` seconds.

    Args:
        path: The file.
        parse: ``text -> value``; its ValueError makes :meth:`value` raise until the file is fixed.
        reload_s: Least seconds between two checks (0: every call).
        clock: Monotonic seconds (tests inject one).
    """

    def __init__(self, path: str, parse: Callable[[str], Any], reload_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.parse, self.reload_s, self.clock = path, parse, reload_s, clock
        self._lock = threading.Lock()
        self._sig: tuple | None = None
        self._checked = -float("inf")
        self._value: Any = None
        self._error = ""

    def _signature(self) -> tuple:
        st = os.stat(self.path)  # follows the symlinks of a mounted Secret
        return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev

    def value(self) -> Any:
        """The parsed content, re-read first when the file changed.

        Raises:
            ValueError: the file cannot be read or does not parse (now, or at its last change).
        """
        with self._lock:
            now = self.clock()
            if now - self._checked >= self.reload_s:
                self._checked = now
                try:
                    sig = self._signature()
                    if sig != self._sig:
                        text = Path(self.path).read_text(encoding="utf-8")
                        self._sig = sig
                        try:
                            self._value, self._error = self.parse(text), ""
                            log.info("control plane: %s (re)loaded", self.path)
                        except ValueError as e:
                            self._value, self._error = None, str(e)
                            log.error("control plane: %s does not parse (%s); its tokens are refused until it is "
                                      "fixed", self.path, e)
                except OSError as e:
                    self._sig, self._value = None, None
                    self._error = f"{self.path} cannot be read ({e.strerror or type(e).__name__})"
            if self._error:
                raise ValueError(self._error)
            return self._value


class JWTVerifier:
    """Verifies OIDC/JWT bearer tokens with PyJWT (``control.jwt``, :class:`~mascot.core.config.JWTConfig`).

    Raises (constructor):
        ValueError: the JWKS file cannot be read or parsed.
    """

    def __init__(self, cfg: Any, reload_s: float = 1.0) -> None:
        import jwt

        self.cfg = cfg
        self._client = None
        self._file = None
        if cfg.jwks_url:
            self._client = jwt.PyJWKClient(cfg.jwks_url, cache_keys=True, lifespan=300, timeout=10)
        else:
            self._file = WatchedFile(cfg.jwks_file, lambda text: jwt.PyJWKSet.from_dict(json.loads(text)), reload_s)
            self._file.value()

    def _key(self, token: str) -> Any:
        import jwt

        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token).key
        keys = self._file.value()
        kid = jwt.get_unverified_header(token).get("kid")
        for k in keys.keys:
            if kid is None or k.key_id == kid:
                return k.key
        raise jwt.InvalidTokenError("no key of the JWKS has the token's key id")

    def verify(self, token: str) -> Identity:
        """The identity of a JWT.

        Raises:
            Unauthenticated: a bad signature, another issuer or audience, an expired or not yet valid token, a token
                without ``exp``/``iss``/``aud``, or one without a known role or identity.
        """
        import jwt

        c = self.cfg
        try:
            claims = jwt.decode(token, self._key(token), algorithms=list(c.algorithms), audience=c.audience,
                                issuer=c.issuer, leeway=c.leeway_s,
                                options={"require": ["exp", "iss", "aud"], "verify_signature": True})
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the JWT has expired; get a new one from the identity provider") from None
        except (jwt.InvalidTokenError, ValueError, KeyError) as e:  # PyJWKClientError is an InvalidTokenError too
            raise Unauthenticated(f"the JWT is not valid for this control plane ({type(e).__name__}: "
                                  f"{str(e)[:120]})") from None
        roles = claims.get(c.role_claim)
        roles = [roles] if isinstance(roles, str) else roles if isinstance(roles, list) else []
        known = [r for r in roles if isinstance(r, str) and r in _RANK]
        name = claims.get(c.identity_claim)
        if not known:
            raise Unauthenticated(f"the JWT's claim {c.role_claim!r} names none of the roles {', '.join(ROLES)}")
        if not isinstance(name, str) or not name:
            raise Unauthenticated(f"the JWT has no {c.identity_claim!r} claim naming the caller")
        return Identity(name[:128], max(known, key=_RANK.__getitem__), "jwt")


class ControlAuth:
    """The control plane's authentication and roles.

    Args:
        tokens: :class:`WatchedFile` of the token file, or a fixed ``digest -> Identity`` map, or None.
        legacy_token: The single admin token of ``adapters.admin_token_*`` ("" = none).
        jwt: A :class:`JWTVerifier`, or None.
    """

    def __init__(self, tokens: "WatchedFile | dict[bytes, Identity] | None", legacy_token: str = "",
                 jwt: JWTVerifier | None = None) -> None:
        self._tokens, self.legacy_token, self.jwt = tokens, legacy_token, jwt

    @property
    def configured(self) -> bool:
        """True when some identity can call."""
        return bool(self._tokens or self.legacy_token or self.jwt)

    @classmethod
    def from_config(cls, cfg: Any, environ: dict[str, str] | None = None) -> "ControlAuth":
        """From ``control`` and ``adapters.admin_token_*`` of a :class:`~mascot.core.config.MascotConfig`.

        Raises:
            ValueError: a token file or variable that does not parse, or an unreadable JWKS file.
        """
        from mascot.gateway.admin import read_admin_token

        c, env = cfg.control, (os.environ if environ is None else environ)
        tokens: WatchedFile | dict[bytes, Identity] | None = None
        if c.tokens_file:
            tokens = WatchedFile(c.tokens_file, lambda t: parse_control_tokens(t, f"control.tokens_file "
                                                                                  f"{c.tokens_file}"), c.reload_s)
            tokens.value()  # a bad file fails the start, not the first call
        elif env.get(c.tokens_env, "").strip():
            tokens = parse_control_tokens(env[c.tokens_env], f"${c.tokens_env}")
        legacy = read_admin_token(cfg.adapters.admin_token_env, cfg.adapters.admin_token_file)
        verifier = JWTVerifier(c.jwt, c.reload_s) if c.jwt.issuer else None
        return cls(tokens, legacy, verifier)

    def _file_tokens(self) -> dict[bytes, Identity]:
        if isinstance(self._tokens, WatchedFile):
            try:
                return self._tokens.value()
            except ValueError as e:
                raise Unavailable(f"the control plane's token file is unusable ({e}); the operator must fix it"
                                  ) from None
        return self._tokens or {}

    def authenticate(self, context: Any) -> Identity:
        """The identity behind a call's bearer token.

        Raises:
            Unauthenticated: no ``authorization`` metadata, not a bearer token, an unknown token, a JWT that fails.
            PermissionDenied: the control plane has no identity configured.
            Unavailable: the token file became unreadable or malformed.
        """
        token = bearer(context)
        if token is None:
            raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
        if not token:
            raise Unauthenticated("an admin token is required: send 'authorization: Bearer <token>' metadata (the "
                                  "mascot CLI reads it from MASCOT_ADMIN_TOKEN or --token-file)")
        if not self.configured:
            raise PermissionDenied("the control plane has no admin identity configured (control.tokens_file, "
                                   "control.jwt or adapters.admin_token_*); it refuses every call")
        if self.jwt is not None and token.count(".") == 2 and token.startswith("eyJ"):
            return self.jwt.verify(token)
        found = self._file_tokens().get(_digest(token))
        if found is not None:
            return found
        if self.legacy_token and hmac.compare_digest(token.encode(), self.legacy_token.encode()):
            return Identity(LEGACY_IDENTITY, "admin", "legacy-token")
        raise Unauthenticated("the admin token is not valid (unknown, revoked or mistyped)")

    def authorize(self, context: Any, method: str, need: str | None = None) -> Identity:
        """:meth:`authenticate`, then check the identity's role against ``need`` (default: the method's least role
        in :data:`METHOD_ROLES`, ``admin`` for a method not listed).

        Raises:
            PermissionDenied: the role is too low (the message names the role needed, never a token); and the errors
                of :meth:`authenticate`.
        """
        who = self.authenticate(context)
        need = need or METHOD_ROLES.get(method, "admin")
        if not who.allows(need):
            raise PermissionDenied(f"{method} needs the role {need} or above; {who.name} has {who.role}")
        return who
