"""Web labelling page: people answer the robot's help requests in a browser.

A FastAPI app (:func:`create_app`) served by uvicorn in a background thread
(:class:`LabellingServer`). It knows nothing about ROS: pending requests come from a
``pending_provider()`` callable and answers go to a ``submit_label(request_id, label,
labeler) -> (accepted, message)`` callable. The ask-for-help node passes one that goes
through its ``ProvideLabel`` path (store, then teach the detector), so a click on the page and
a service call are the same answer.

The page lists pending requests with the crop (the object's box outlined on it), the reason,
the robot that asked, one button per candidate and a free-text field for a new class, and
polls ``/api/requests`` (every ``poll_interval_s``) so new requests appear and answered ones
disappear without a reload. On a fleet's store the list holds every robot's requests; a
menu shows one robot's only (``/api/requests?robot=ID`` does the same for programs).

Access
    By default the server binds to ``127.0.0.1``: only programs on the robot itself can reach
    it (use an SSH tunnel, ``ssh -L 8765:127.0.0.1:8765 robot``, to label from another
    machine). Binding to any other address requires a ``token`` (or an explicit
    ``allow_insecure_remote=True`` for a trusted, isolated network): every request must then
    carry it, as ``Authorization: Bearer <token>`` or as the cookie the server sets when the
    page is opened once as ``http://host:port/?token=<token>`` (HttpOnly, SameSite=Strict).
    Tokens are compared in constant time. The ``Host`` header is checked against the bound
    address (and ``localhost`` for loopback) to defeat DNS rebinding, answers must be JSON
    POSTs (so a cross-site HTML form cannot submit one), and responses carry a strict
    Content-Security-Policy. The token is no substitute for TLS on an untrusted network: put
    a TLS-terminating reverse proxy in front, or use the SSH tunnel.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from uq_autonomy.labels.store import PendingRequest
from uq_autonomy.labels.validation import (
    LabelValidationError,
    validate_label,
    validate_labeler,
    validate_request_id,
)

_log = logging.getLogger(__name__)

SubmitLabel = Callable[[str, str, str], tuple[bool, str]]
PendingProvider = Callable[[], Sequence[PendingRequest]]

TOKEN_COOKIE = 'uq_labelling_token'
MIN_TOKEN_LENGTH = 16
MAX_BODY_BYTES = 4096
_LOOPBACK_NAMES = ('localhost',)


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip('[]')).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class WebConfig:
    """Where and how the labelling page is served; validated on construction.

    Parameters
    ----------
    host : str
        Address to bind (``127.0.0.1`` by default: this machine only).
    port : int
        TCP port; 0 picks a free one (see :attr:`LabellingServer.port`).
    token : str or None
        Access token, at least 16 printable ASCII characters without spaces; required unless
        ``host`` is a loopback address or ``allow_insecure_remote`` is set.
    allow_insecure_remote : bool
        Allow a non-loopback ``host`` without a token (trusted, isolated networks only).
    allowed_hosts : tuple of str or None
        Accepted ``Host`` header names; None derives them from ``host`` (loopback: the
        loopback names; a specific address: that address; ``0.0.0.0``/``::``: any, the token
        guarding access).
    poll_interval_s : float
        How often the page asks for new requests, 0.2-60 s.
    title : str
        Page title.

    Raises
    ------
    ValueError
        On an invalid value, or a non-loopback host without a token.
    """

    host: str = '127.0.0.1'
    port: int = 8765
    token: str | None = None
    allow_insecure_remote: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    poll_interval_s: float = 1.0
    title: str = 'Help the robot: what is this object?'

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f'host must be a non-empty string, got {self.host!r}')
        if (not isinstance(self.port, int) or isinstance(self.port, bool)
                or not 0 <= self.port <= 65535):
            raise ValueError(f'port must be an integer in [0, 65535], got {self.port!r}')
        if self.token is not None:
            if (not isinstance(self.token, str) or len(self.token) < MIN_TOKEN_LENGTH
                    or not all(33 <= ord(c) <= 126 for c in self.token)):
                raise ValueError(
                    f'token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters '
                    f'without spaces')
        elif not _is_loopback(self.host) and not self.allow_insecure_remote:
            raise ValueError(
                f'binding the labelling page to {self.host} (reachable from other machines) '
                f'needs a token; set one, bind to 127.0.0.1 and use an SSH tunnel, or set '
                f'allow_insecure_remote on a trusted network')
        if not (isinstance(self.poll_interval_s, int | float)
                and math.isfinite(self.poll_interval_s) and 0.2 <= self.poll_interval_s <= 60):
            raise ValueError(f'poll_interval_s must be in [0.2, 60], got {self.poll_interval_s!r}')
        if not isinstance(self.title, str) or not self.title.isprintable():
            raise ValueError('title must be printable text')

    def host_names(self) -> set[str] | None:
        """Accepted ``Host`` header names (without port); None accepts any."""
        if self.allowed_hosts is not None:
            return {h.lower() for h in self.allowed_hosts}
        if _is_loopback(self.host):
            return {'localhost', '127.0.0.1', '[::1]', '::1', self.host.lower()}
        if self.host in ('0.0.0.0', '::', '[::]'):
            return None
        return {self.host.lower(), f'[{self.host.lower()}]'}


def _strip_port(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith('['):
        return host[:host.index(']') + 1] if ']' in host else host
    return host.rsplit(':', 1)[0] if host.count(':') == 1 else host


def _request_json(r: PendingRequest) -> dict[str, Any]:
    return {
        'request_id': r.request_id,
        'reason': r.reason,
        'candidates': [{'label': label, 'probability': p} for label, p in r.candidates],
        'created': r.created,
        'class_name': r.class_name,
        'track_id': r.track_id,
        'robot_id': r.robot_id,
        'crop_url': f'/api/requests/{r.request_id}/crop.png' if r.crop_png else None,
        # The object's box in crop pixels, COCO (x, y, width, height): the page outlines it.
        'box': None if r.box is None else [float(v) for v in r.box],
    }


_SECURITY_HEADERS = {
    'Content-Security-Policy': ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"),
    'X-Content-Type-Options': 'nosniff',
    'X-Frame-Options': 'DENY',
    'Referrer-Policy': 'no-referrer',
}


def create_app(pending_provider: PendingProvider, submit_label: SubmitLabel,
               config: WebConfig | None = None) -> FastAPI:
    """The labelling page's FastAPI app.

    Parameters
    ----------
    pending_provider : callable
        Returns the pending requests (e.g. ``store.pending_requests`` or the node's list).
        Exceptions are reported on the page (HTTP 503), never crash the server.
    submit_label : callable
        ``submit_label(request_id, label, labeler) -> (accepted, message)``, called from a
        worker thread with validated, normalised arguments. Exceptions become HTTP 500 with
        the message shown on the page.
    config : WebConfig
        Token, allowed hosts, poll interval, title.
    """
    cfg = config or WebConfig()
    hosts = cfg.host_names()
    app = FastAPI(title='uq_autonomy labelling', docs_url=None, redoc_url=None,
                  openapi_url=None)
    crops: dict[str, bytes] = {}
    crops_lock = threading.Lock()

    def authorised(request: Request) -> bool:
        if cfg.token is None:
            return True
        expected = cfg.token.encode()
        header = request.headers.get('authorization', '')
        if header.startswith('Bearer ') and hmac.compare_digest(header[7:].encode(), expected):
            return True
        cookie = request.cookies.get(TOKEN_COOKIE, '')
        return hmac.compare_digest(cookie.encode(), expected)

    @app.middleware('http')
    async def guard(request: Request, call_next: Callable) -> Response:
        host = _strip_port(request.headers.get('host', ''))
        if hosts is not None and host not in hosts:
            response: Response = JSONResponse(
                {'error': f'host {host!r} is not served here'}, status_code=400)
        elif request.url.path == '/healthz':
            response = await call_next(request)
        elif cfg.token is not None and request.url.path == '/' and 'token' in request.query_params:
            given = request.query_params['token'].encode()
            if hmac.compare_digest(given, cfg.token.encode()):
                # Trade the token in the URL for a cookie, and drop it from the address bar.
                response = RedirectResponse('/', status_code=303)
                response.set_cookie(TOKEN_COOKIE, cfg.token, httponly=True, samesite='strict',
                                    path='/')
            else:
                response = _unauthorised(request)
        elif not authorised(request):
            response = _unauthorised(request)
        else:
            response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    def pending() -> tuple[list[PendingRequest], str | None]:
        try:
            items = list(pending_provider())
        except Exception as err:  # the page reports it; the server keeps serving
            _log.warning('labelling page: pending requests unavailable: %s', err)
            return [], f'pending requests are unavailable: {err}'
        with crops_lock:
            crops.clear()
            crops.update({r.request_id: r.crop_png for r in items if r.crop_png})
        return items, None

    @app.get('/', response_class=HTMLResponse)
    def page() -> HTMLResponse:
        html = (_PAGE.replace('{{TITLE}}', _html_escape(cfg.title))
                .replace('{{POLL_MS}}', str(int(cfg.poll_interval_s * 1000))))
        return HTMLResponse(html, headers={'Cache-Control': 'no-store'})

    @app.get('/static/app.js')
    def script() -> Response:
        return Response(_SCRIPT, media_type='text/javascript')

    @app.get('/static/app.css')
    def style() -> Response:
        return Response(_STYLE, media_type='text/css')

    @app.get('/healthz')
    def healthz() -> dict[str, bool]:
        return {'ok': True}

    @app.get('/api/requests')
    def list_requests(robot: str | None = None) -> JSONResponse:
        items, error = pending()
        robots = sorted({r.robot_id for r in items})
        if robot is not None:
            items = [r for r in items if r.robot_id == robot]
        body = [_request_json(r) for r in items]
        version = hashlib.sha256(json.dumps(
            [(r['request_id'], r['reason']) for r in body]).encode()).hexdigest()[:16]
        return JSONResponse({'requests': body, 'robots': robots, 'error': error,
                             'version': version},
                            status_code=503 if error else 200,
                            headers={'Cache-Control': 'no-store'})

    @app.get('/api/requests/{request_id}/crop.png')
    def crop(request_id: str) -> Response:
        with crops_lock:
            data = crops.get(request_id)
        if data is None:
            items, _error = pending()
            data = next((r.crop_png for r in items if r.request_id == request_id), None)
        if data is None:
            return JSONResponse({'error': f'no pending request {request_id!r} with a crop'},
                                status_code=404)
        # A request id names one crop for good, so the browser may keep it.
        return Response(data, media_type='image/png',
                        headers={'Cache-Control': 'private, max-age=3600'})

    @app.post('/api/requests/{request_id}/label')
    async def label(request_id: str, request: Request) -> JSONResponse:
        content_type = request.headers.get('content-type', '').split(';')[0].strip().lower()
        if content_type != 'application/json':
            return JSONResponse({'accepted': False,
                                 'message': 'send the answer as application/json'},
                                status_code=415)
        declared = request.headers.get('content-length')
        if declared is not None:
            length = _declared_length(declared)
            if length is None:
                return JSONResponse({'accepted': False,
                                     'message': f'malformed answer: Content-Length '
                                                f'{declared!r:.40} is not a byte count'},
                                    status_code=400)
            if length > MAX_BODY_BYTES:
                return _too_large()  # refused unread: the declared size alone decides
        raw = await _body_up_to(request, MAX_BODY_BYTES)
        if raw is None:
            return _too_large()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError('the answer must be a JSON object')
            rid = validate_request_id(request_id)
            text = validate_label(body.get('label'))
            who = validate_labeler(body.get('labeler') or 'web')
        except LabelValidationError as err:
            return JSONResponse({'accepted': False, 'message': str(err)}, status_code=422)
        except ValueError as err:
            return JSONResponse({'accepted': False, 'message': f'malformed answer: {err}'},
                                status_code=400)
        return await _run_submit(submit_label, rid, text, who)

    return app


def _too_large() -> JSONResponse:
    return JSONResponse({'accepted': False,
                         'message': f'answer too large: at most {MAX_BODY_BYTES} bytes'},
                        status_code=413)


def _declared_length(value: str) -> int | None:
    """The byte count a Content-Length header declares, or ``None`` when it is not one
    (a number too long to matter reads as 10**18 rather than being parsed)."""
    if not (value.isascii() and value.isdigit()):
        return None
    digits = value.lstrip('0')
    return int(digits or '0') if len(digits) <= 18 else 10 ** 18


async def _body_up_to(request: Request, limit: int) -> bytes | None:
    """The request body, or ``None`` as soon as it exceeds ``limit`` bytes: a body sent
    without a Content-Length (chunked) is read no further than that."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b''.join(chunks)


async def _run_submit(submit_label: SubmitLabel, rid: str, text: str,
                      who: str) -> JSONResponse:
    try:
        accepted, message = await run_in_threadpool(submit_label, rid, text, who)
    except Exception as err:
        _log.exception('labelling page: submitting %s failed', rid)
        return JSONResponse({'accepted': False,
                             'message': f'the answer could not be processed: {err}'},
                            status_code=500)
    return JSONResponse({'accepted': bool(accepted), 'message': str(message)},
                        status_code=200 if accepted else 409)


def _unauthorised(request: Request) -> Response:
    if request.url.path.startswith('/api/'):
        return JSONResponse({'error': 'access token required'}, status_code=401,
                            headers={'WWW-Authenticate': 'Bearer'})
    return HTMLResponse('<!doctype html><title>Access token required</title>'
                        '<p>Access token required: open the address the robot printed '
                        '(it ends in <code>/?token=...</code>).</p>', status_code=401)


def _html_escape(text: str) -> str:
    return (text.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')
            .replace('"', '&quot;'))


class LabellingServer:
    """Serves :func:`create_app` with uvicorn in a background (daemon) thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Raises
    ------
    OSError
        From :meth:`start` when the address cannot be bound (port in use, no such address).
    """

    def __init__(self, pending_provider: PendingProvider, submit_label: SubmitLabel,
                 config: WebConfig | None = None) -> None:
        self.config = config or WebConfig()
        self.app = create_app(pending_provider, submit_label, self.config)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port = self.config.port

    @property
    def url(self) -> str:
        """Base address of the page (without the token)."""
        host = self.config.host
        if host in ('0.0.0.0', '::'):
            host = '127.0.0.1'
        elif ':' in host:
            host = f'[{host}]'
        return f'http://{host}:{self.port}/'

    def start(self, timeout_s: float = 10.0) -> LabellingServer:
        """Bind, start serving and wait until the server accepts connections."""
        if self._thread is not None:
            return self
        family = socket.AF_INET6 if ':' in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.host, self.config.port))
        except OSError as err:
            sock.close()
            raise OSError(err.errno, f'cannot serve the labelling page on '
                                     f'{self.config.host}:{self.config.port}: {err.strerror}'
                          ) from err
        sock.listen(64)
        sock.set_inheritable(True)
        self._socket = sock
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(
            self.app, log_level='warning', lifespan='off', access_log=False,
            timeout_graceful_shutdown=2))
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={'sockets': [sock]},
                                        name='labelling-web', daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError('the labelling page server did not start')
            time.sleep(0.02)
        _log.info('labelling page at %s', self.url)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> LabellingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def store_submitter(store: Any, on_stored: Callable[[Any], None] | None = None) -> SubmitLabel:
    """A ``submit_label`` that answers in a :class:`~uq_autonomy.labels.store.LabelStore`
    (for a stand-alone page or tests; the node passes its ``ProvideLabel`` path instead).
    ``on_stored(record)`` is called after a new or overruled label is committed."""
    from uq_autonomy.labels.store import LabelStoreError

    def submit(request_id: str, label: str, labeler: str) -> tuple[bool, str]:
        try:
            result = store.answer(request_id, label, labeler, source='web')
        except LabelStoreError as err:
            return False, str(err)
        if result.changed and on_stored is not None:
            on_stored(result.record)
        return result.accepted, result.message

    return submit


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<link rel="stylesheet" href="/static/app.css">
<script src="/static/app.js" defer></script>
</head>
<body data-poll-ms="{{POLL_MS}}">
<header>
  <h1>{{TITLE}}</h1>
  <label>Your name <input id="labeler" data-testid="labeler" maxlength="64"
    autocomplete="name" placeholder="web"></label>
  <label>Robot <select id="robot-filter" data-testid="robot-filter">
    <option value="">every robot</option></select></label>
  <span id="live" data-testid="live" aria-live="polite">connecting...</span>
</header>
<div id="banner" data-testid="banner" role="alert" hidden></div>
<p id="empty" data-testid="empty" hidden>No pending requests. The robot will ask here when it
is unsure what it sees.</p>
<main id="requests"></main>
</body>
</html>
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem; }
header { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; }
header h1 { font-size: 1.3rem; margin: 0 auto 0 0; }
#live { color: #666; font-size: 0.85rem; }
#banner { background: #fde2e1; color: #7a1712; padding: 0.5rem 1rem; margin: 1rem 0; }
main { display: grid; gap: 1rem; grid-template-columns: repeat(auto-fill, minmax(17rem, 1fr));
       margin-top: 1rem; }
article { border: 1px solid #ccc; border-radius: 0.5rem; padding: 0.75rem; }
article.answered { border-color: #2e7d32; background: #edf7ed; }
.crop { position: relative; }
article img { display: block; width: 100%; max-height: 16rem; object-fit: contain;
              image-rendering: pixelated; background: #222; }
/* The outline of the object's box: an SVG over the whole img whose viewBox is the crop's
   pixel grid; xMidYMid meet maps it as object-fit: contain maps the image. */
.crop svg { position: absolute; inset: 0; width: 100%; height: 100%; pointer-events: none; }
.crop rect { fill: none; stroke: #ffd600; stroke-width: 2px; vector-effect: non-scaling-stroke; }
.reason { font-size: 0.9rem; }
.robot { font-size: 0.8rem; color: #555; margin: 0.3rem 0 0; }
.candidates { display: flex; flex-wrap: wrap; gap: 0.4rem; }
.candidates button { font-size: 1rem; padding: 0.3rem 0.7rem; }
.candidates small { color: #555; }
form { display: flex; gap: 0.4rem; margin-top: 0.6rem; }
form input { flex: 1; min-width: 0; }
.status { min-height: 1.2rem; font-size: 0.9rem; }
.status.refused { color: #b3261e; }
.status.accepted { color: #2e7d32; }
"""

_SCRIPT = r"""
'use strict';
(() => {
  const pollMs = Number(document.body.dataset.pollMs) || 1000;
  const keepMs = 3000;
  const list = document.getElementById('requests');
  const banner = document.getElementById('banner');
  const empty = document.getElementById('empty');
  const live = document.getElementById('live');
  const labelerInput = document.getElementById('labeler');
  const robotFilter = document.getElementById('robot-filter');
  const cards = new Map();
  let lastRequests = [];
  const UNKNOWN = '(unknown)';  // requests stored before robots had ids
  robotFilter.addEventListener('change', () => render(lastRequests));
  labelerInput.value = localStorage.getItem('uq-labeler') || '';
  labelerInput.addEventListener('change', () => {
    localStorage.setItem('uq-labeler', labelerInput.value.trim());
  });

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function setBusy(card, busy) {
    for (const control of card.querySelectorAll('button, input')) control.disabled = busy;
  }

  async function submit(card, requestId, label) {
    const status = card.querySelector('.status');
    setBusy(card, true);
    status.className = 'status';
    status.textContent = 'sending "' + label + '"...';
    let body = {accepted: false, message: 'no answer from the robot'};
    try {
      const response = await fetch('/api/requests/' + encodeURIComponent(requestId) + '/label', {
        method: 'POST', headers: {'Content-Type': 'application/json'},
        credentials: 'same-origin',
        body: JSON.stringify({label: label, labeler: labelerInput.value.trim() || 'web'}),
      });
      body = await response.json();
    } catch (err) {
      body = {accepted: false, message: 'could not reach the robot: ' + err};
    }
    status.textContent = body.message;
    status.className = 'status ' + (body.accepted ? 'accepted' : 'refused');
    if (body.accepted) {
      card.classList.add('answered');
      card.dataset.answeredAt = String(Date.now());
    } else {
      setBusy(card, false);
    }
  }

  // The box (crop pixels, x y width height) drawn over the crop. Hidden until the image
  // has loaded: the viewBox needs its pixel size, and the SVG scales with the shown size.
  function outline(img, box) {
    const SVG = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('preserveAspectRatio', 'xMidYMid meet');
    svg.setAttribute('visibility', 'hidden');
    svg.setAttribute('aria-hidden', 'true');
    const rect = document.createElementNS(SVG, 'rect');
    rect.setAttribute('data-testid', 'crop-box');
    ['x', 'y', 'width', 'height'].forEach((name, i) => rect.setAttribute(name, String(box[i])));
    svg.append(rect);
    const fit = () => {
      if (!img.naturalWidth || !img.naturalHeight) return;
      svg.setAttribute('viewBox', '0 0 ' + img.naturalWidth + ' ' + img.naturalHeight);
      svg.removeAttribute('visibility');
    };
    img.addEventListener('load', fit);
    if (img.complete) fit();
    return svg;
  }

  function makeCard(request) {
    const card = el('article', {'data-testid': 'request-card',
                                'data-request-id': request.request_id});
    if (request.crop_url) {
      const frame = el('div', {class: 'crop'});
      const img = el('img', {src: request.crop_url, 'data-testid': 'crop',
                             alt: 'the object the robot is unsure about'});
      frame.append(img);
      if (request.box) frame.append(outline(img, request.box));
      card.append(frame);
    }
    card.append(el('p', {class: 'robot', 'data-testid': 'robot'},
                   'robot ' + (request.robot_id || UNKNOWN)));
    card.append(el('p', {class: 'reason', 'data-testid': 'reason'}, request.reason));
    const buttons = el('div', {class: 'candidates'});
    for (const candidate of request.candidates) {
      const button = el('button', {type: 'button', 'data-testid': 'candidate',
                                   'data-label': candidate.label}, candidate.label + ' ');
      button.append(el('small', {}, Math.round(candidate.probability * 100) + '%'));
      button.addEventListener('click', () => submit(card, request.request_id, candidate.label));
      buttons.append(button);
    }
    card.append(buttons);
    const form = el('form', {'data-testid': 'new-class-form'});
    const input = el('input', {name: 'label', maxlength: '64', required: '',
                               placeholder: 'something else: type its name',
                               'data-testid': 'new-label', 'aria-label': 'new class name'});
    form.append(input, el('button', {type: 'submit', 'data-testid': 'submit-new'}, 'Teach'));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const label = input.value.trim();
      if (label) submit(card, request.request_id, label);
    });
    card.append(form, el('p', {class: 'status', role: 'status', 'data-testid': 'status'}));
    return card;
  }

  function updateRobots(robots) {
    const known = new Set([...robotFilter.options].map((o) => o.value));
    for (const robot of robots) {
      const value = robot || UNKNOWN;
      if (!known.has(value)) robotFilter.append(el('option', {value: value}, value));
    }
  }

  function render(all) {
    lastRequests = all;
    const wanted = robotFilter.value;
    const requests = wanted ? all.filter((r) => (r.robot_id || UNKNOWN) === wanted) : all;
    const ids = new Set(requests.map((r) => r.request_id));
    const now = Date.now();
    for (const [id, card] of cards) {
      // An answered card stays a moment so the person sees the robot's reply.
      const keep = card.dataset.answeredAt && now - Number(card.dataset.answeredAt) < keepMs;
      if (!ids.has(id) && !keep) { card.remove(); cards.delete(id); }
    }
    for (const request of requests) {
      if (!cards.has(request.request_id)) {
        const card = makeCard(request);
        cards.set(request.request_id, card);
        list.append(card);
      }
    }
    empty.hidden = cards.size > 0;
  }

  async function poll() {
    try {
      const response = await fetch('/api/requests', {cache: 'no-store',
                                                     credentials: 'same-origin'});
      const body = await response.json();
      if (response.status === 401) throw new Error('access token required; reopen the link');
      updateRobots(body.robots || []);
      render(body.requests || []);
      banner.hidden = !body.error;
      banner.textContent = body.error || '';
      live.textContent = 'live, updated ' + new Date().toLocaleTimeString();
    } catch (err) {
      banner.hidden = false;
      banner.textContent = 'connection to the robot lost (' + err.message + '); retrying';
      live.textContent = 'offline';
    } finally {
      setTimeout(poll, pollMs);
    }
  }
  poll();
})();
"""
