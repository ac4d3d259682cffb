"""Web labelling page: the HTTP API, access control, and a real headless Chromium session.

The browser tests drive Debian's ``chromium`` (installed by ``make setup``) through
Playwright, with ``executable_path`` so Playwright never downloads a browser. They open the
page, see the pending request's crop, click a candidate and check that the answer reached
the ``submit_label`` callable and landed in a real :class:`LabelStore`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from uq_autonomy.help.crops import encode_png
from uq_autonomy.labels.store import LabelStore, LabelStoreLockedError, PendingRequest
from uq_autonomy.labels.web import (
    TOKEN_COOKIE,
    LabellingServer,
    WebConfig,
    create_app,
    store_submitter,
)

CHROMIUM = '/usr/bin/chromium'
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu',
                 '--disable-background-networking', '--disable-component-update',
                 '--no-first-run']
TOKEN = 'correct-horse-battery-staple'


def crop_pixels(h: int = 24, w: int = 32) -> np.ndarray:
    image = np.zeros((h, w, 3), np.uint8)
    image[:, : w // 2] = (220, 30, 30)
    image[:, w // 2:] = (30, 30, 220)
    return image


def pending(rid: str, reason: str = 'GP variance 0.031 above 0.02 in 4 of the last 5 frames',
            **kw: object) -> PendingRequest:
    fields = dict(reason=reason, candidates=(('mug', 0.62), ('box', 0.21)),
                  crop_png=encode_png(crop_pixels()), box=(4.0, 3.0, 20.0, 15.0),
                  embedding=np.ones(16), model_id='m1', class_name='mug', track_id=3)
    fields.update(kw)
    return PendingRequest(rid, **fields)  # type: ignore[arg-type]


class Recorder:
    """``submit_label`` that records its calls and answers in a real store."""

    def __init__(self, store: LabelStore) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self._submit = store_submitter(store)
        self._lock = threading.Lock()

    def __call__(self, request_id: str, label: str, labeler: str) -> tuple[bool, str]:
        with self._lock:
            self.calls.append((request_id, label, labeler))
        return self._submit(request_id, label, labeler)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LabelStore]:
    s = LabelStore(tmp_path / 'labels.sqlite3')
    yield s
    s.close()


def client(store: LabelStore, submit: object = None, **config: object) -> TestClient:
    app = create_app(store.pending_requests, submit or store_submitter(store),
                     WebConfig(**config))  # type: ignore[arg-type]
    return TestClient(app, base_url='http://127.0.0.1:8765')


# -- configuration ---------------------------------------------------------------------------

@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'host': '0.0.0.0'}, 'binding the labelling page to 0.0.0.0 .* needs a token'),
    ({'host': '192.168.1.20'}, 'binding the labelling page to 192.168.1.20'),
    ({'token': 'short'}, 'token must be at least 16 printable ASCII characters'),
    ({'token': 'has spaces in the token'}, 'token must be at least 16 printable ASCII'),
    ({'port': 70000}, r'port must be an integer in \[0, 65535\], got 70000'),
    ({'port': '8080'}, r"port must be an integer in \[0, 65535\], got '8080'"),
    ({'host': ''}, 'host must be a non-empty string'),
    ({'poll_interval_s': 0.01}, r'poll_interval_s must be in \[0.2, 60\]'),
    ({'title': 'a\nb'}, 'title must be printable text'),
])
def test_invalid_web_config_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WebConfig(**kwargs)


def test_remote_binding_is_allowed_with_a_token_or_explicitly() -> None:
    assert WebConfig(host='0.0.0.0', token=TOKEN).host_names() is None
    assert WebConfig(host='192.168.1.20', allow_insecure_remote=True).host_names() == {
        '192.168.1.20', '[192.168.1.20]'}
    assert 'localhost' in WebConfig().host_names()
    assert WebConfig(host='::1').host_names() >= {'[::1]', 'localhost'}


# -- HTTP API --------------------------------------------------------------------------------

def test_page_and_request_list(store: LabelStore) -> None:
    store.add_request(pending('r1'))
    store.add_request(pending('r2', crop_png=None))
    c = client(store, title='Robot asks')
    page = c.get('/')
    assert page.status_code == 200 and '<title>Robot asks</title>' in page.text
    assert "script-src 'self'" in page.headers['content-security-policy']
    assert page.headers['x-frame-options'] == 'DENY'
    assert c.get('/static/app.js').headers['content-type'].startswith('text/javascript')
    body = c.get('/api/requests').json()
    assert body['error'] is None
    first, second = body['requests']
    assert first == {'request_id': 'r1',
                     'reason': 'GP variance 0.031 above 0.02 in 4 of the last 5 frames',
                     'candidates': [{'label': 'mug', 'probability': 0.62},
                                    {'label': 'box', 'probability': 0.21}],
                     'created': first['created'], 'class_name': 'mug', 'track_id': 3,
                     'robot_id': '', 'crop_url': '/api/requests/r1/crop.png',
                     'box': [4.0, 3.0, 20.0, 15.0]}
    assert second['crop_url'] is None
    store.add_request(pending('r3', box=None))
    assert c.get('/api/requests').json()['requests'][2]['box'] is None
    crop = c.get('/api/requests/r1/crop.png')
    assert crop.headers['content-type'] == 'image/png'
    assert crop.content == encode_png(crop_pixels())
    assert c.get('/api/requests/nope/crop.png').status_code == 404


def test_every_robots_requests_are_listed_and_filtered_by_robot(store: LabelStore) -> None:
    for rid, robot in (('a1', 'robot-a'), ('b1', 'robot-b'), ('a2', 'robot-a')):
        store.add_request(pending(rid, robot_id=robot))
    c = client(store)
    body = c.get('/api/requests').json()
    assert [r['request_id'] for r in body['requests']] == ['a1', 'b1', 'a2']
    assert body['robots'] == ['robot-a', 'robot-b']
    only_a = c.get('/api/requests', params={'robot': 'robot-a'}).json()
    assert [r['robot_id'] for r in only_a['requests']] == ['robot-a', 'robot-a']
    assert only_a['robots'] == ['robot-a', 'robot-b']  # the menu keeps every robot
    assert c.get('/api/requests', params={'robot': 'nobody'}).json()['requests'] == []


def test_answers_go_through_submit_label(store: LabelStore) -> None:
    store.add_request(pending('r1'))
    recorder = Recorder(store)
    c = client(store, recorder)
    ok = c.post('/api/requests/r1/label', json={'label': '  mug ', 'labeler': 'ann'})
    assert ok.status_code == 200
    assert ok.json() == {'accepted': True, 'message': "stored label 'mug' for request r1 "
                                                      '(by ann)'}
    assert recorder.calls == [('r1', 'mug', 'ann')]  # validated and normalised first
    refused = c.post('/api/requests/r1/label', json={'label': 'cup'})
    assert refused.status_code == 409 and refused.json()['accepted'] is False
    assert "already answered 'mug' by ann" in refused.json()['message']
    assert recorder.calls[-1] == ('r1', 'cup', 'web')  # default labeler
    assert store.get_label('r1').label == 'mug'
    assert c.get('/api/requests').json()['requests'] == []


@pytest.mark.parametrize(('body', 'headers', 'status', 'message'), [
    ({'label': ''}, None, 422, 'label must not be empty'),
    ({'label': 'x' * 65}, None, 422, 'label is 65 characters long'),
    ({'label': 'a\u0000b'}, None, 422, 'non-printable character'),
    ({'label': 5}, None, 422, 'label must be a string, got int'),
    ({'label': 'mug', 'labeler': 'x' * 80}, None, 422, 'labeler is 80 characters long'),
    ('[1]', {'content-type': 'application/json'}, 400, 'the answer must be a JSON object'),
    ('{oops', {'content-type': 'application/json'}, 400, 'malformed answer'),
    ('label=mug', {'content-type': 'application/x-www-form-urlencoded'}, 415,
     'send the answer as application/json'),
    ('{"label": "' + 'x' * 5000 + '"}', {'content-type': 'application/json'}, 413,
     'answer too large'),
])
def test_malformed_answers_are_refused_before_submit(store: LabelStore, body: object,
                                                     headers: dict | None, status: int,
                                                     message: str) -> None:
    store.add_request(pending('r1'))
    recorder = Recorder(store)
    c = client(store, recorder)
    if isinstance(body, dict):
        response = c.post('/api/requests/r1/label', json=body)
    else:
        response = c.post('/api/requests/r1/label', content=body, headers=headers)
    assert response.status_code == status
    assert message in response.json()['message']
    assert recorder.calls == []


def _raw_post(port: int, head: bytes, body_chunks: list[bytes]) -> bytes:
    """Send a POST's head and body chunks without ever ending the body, then read what the
    server answers: it must decide from what it has, not wait for the rest."""
    with socket.create_connection(('127.0.0.1', port), timeout=10.0) as s:
        s.sendall(b'POST /api/requests/r1/label HTTP/1.1\r\nHost: 127.0.0.1\r\n'
                  b'Content-Type: application/json\r\n' + head + b'\r\n')
        for chunk in body_chunks:
            s.sendall(chunk)
        reply = b''
        while b'\r\n\r\n' not in reply:
            reply += s.recv(65536)
        head_part, _, body = reply.partition(b'\r\n\r\n')
        length = int(next(line.split(b':')[1] for line in head_part.split(b'\r\n')
                          if line.lower().startswith(b'content-length:')))
        while len(body) < length:
            body += s.recv(65536)
        return head_part + b'\r\n\r\n' + body


def test_oversize_answers_are_refused_without_reading_them(store: LabelStore) -> None:
    store.add_request(pending('r1'))
    recorder = Recorder(store)
    server = LabellingServer(store.pending_requests, recorder, WebConfig(port=0)).start()
    try:
        # A declared gigabyte: refused on the header, none of it sent.
        reply = _raw_post(server.port, b'Content-Length: 1000000000\r\n', [])
        assert reply.startswith(b'HTTP/1.1 413') and b'answer too large' in reply
        # No length declared (chunked): refused once more than 4 KiB has come, the body
        # never finished.
        chunk = b'400\r\n' + b'x' * 0x400 + b'\r\n'
        reply = _raw_post(server.port, b'Transfer-Encoding: chunked\r\n', [chunk] * 5)
        assert reply.startswith(b'HTTP/1.1 413') and b'at most 4096 bytes' in reply
    finally:
        server.stop()
    assert recorder.calls == []


def test_a_content_length_that_is_no_byte_count_is_refused(store: LabelStore) -> None:
    store.add_request(pending('r1'))
    recorder = Recorder(store)
    response = client(store, recorder).post(
        '/api/requests/r1/label', content=b'{"label": "mug"}',
        headers={'content-type': 'application/json', 'content-length': b'\xb2'})
    assert response.status_code == 400
    assert 'is not a byte count' in response.json()['message']
    assert recorder.calls == []


def test_bad_request_id_in_the_path(store: LabelStore) -> None:
    response = client(store).post('/api/requests/a%20b/label', json={'label': 'mug'})
    assert response.status_code == 422 and 'is invalid' in response.json()['message']


def test_failures_behind_the_page_are_reported_not_fatal(store: LabelStore) -> None:
    def broken_provider() -> list:
        raise LabelStoreLockedError('label store /x/labels.sqlite3 is locked by another '
                                    'process')

    def broken_submit(rid: str, label: str, labeler: str) -> tuple[bool, str]:
        raise RuntimeError('detector unreachable')

    app = create_app(broken_provider, broken_submit)
    c = TestClient(app, base_url='http://127.0.0.1')
    listing = c.get('/api/requests')
    assert listing.status_code == 503
    assert listing.json()['error'] == ('pending requests are unavailable: label store '
                                       '/x/labels.sqlite3 is locked by another process')
    answer = c.post('/api/requests/r1/label', json={'label': 'mug'})
    assert answer.status_code == 500
    assert answer.json() == {'accepted': False,
                             'message': 'the answer could not be processed: detector '
                                        'unreachable'}
    assert c.get('/healthz').json() == {'ok': True}


def test_foreign_host_headers_are_refused(store: LabelStore) -> None:
    c = client(store)
    assert c.get('/', headers={'host': 'evil.example:8765'}).status_code == 400
    assert c.get('/', headers={'host': 'localhost:8765'}).status_code == 200
    assert c.get('/', headers={'host': '[::1]:8765'}).status_code == 200


def test_token_protects_everything_but_health(store: LabelStore) -> None:
    store.add_request(pending('r1'))
    c = client(store, host='0.0.0.0', token=TOKEN)
    assert c.get('/').status_code == 401
    assert 'Access token required' in c.get('/').text
    assert c.get('/api/requests').status_code == 401
    assert c.get('/api/requests/r1/crop.png').status_code == 401
    assert c.post('/api/requests/r1/label', json={'label': 'mug'}).status_code == 401
    assert c.get('/?token=wrong-token-wrong-token').status_code == 401
    assert c.get('/healthz').status_code == 200
    bearer = {'authorization': f'Bearer {TOKEN}'}
    assert c.get('/api/requests', headers=bearer).status_code == 200
    # Opening the link with the token sets an HttpOnly cookie and drops the token from the URL.
    response = c.get(f'/?token={TOKEN}', follow_redirects=False)
    assert response.status_code == 303 and response.headers['location'] == '/'
    cookie = response.headers['set-cookie']
    assert f'{TOKEN_COOKIE}={TOKEN}' in cookie and 'HttpOnly' in cookie
    assert 'samesite=strict' in cookie.lower()
    c.cookies.set(TOKEN_COOKIE, TOKEN)
    assert c.get('/').status_code == 200
    assert c.post('/api/requests/r1/label', json={'label': 'mug'}).json()['accepted']


def test_server_binds_a_free_port_and_releases_it(store: LabelStore) -> None:
    server = LabellingServer(store.pending_requests, store_submitter(store),
                             WebConfig(port=0)).start()
    port = server.port
    try:
        assert port != 0 and server.url == f'http://127.0.0.1:{port}/'
        with pytest.raises(OSError, match=f'cannot serve the labelling page on '
                                          f'127.0.0.1:{port}'):
            LabellingServer(store.pending_requests, store_submitter(store),
                            WebConfig(port=port)).start()
    finally:
        server.stop()
    server.stop()
    with socket.socket() as s:  # the port is free again
        s.bind(('127.0.0.1', port))


# -- real browser ----------------------------------------------------------------------------

def reply(page: object, card: object, expect: str = 'stored') -> str:
    """The card's status line once it holds ``expect`` (read in the browser, in one step)."""
    status = card.locator('[data-testid=status]').element_handle()
    return page.wait_for_function(
        '([el, expect]) => el.textContent.includes(expect) && el.textContent',
        arg=[status, expect]).json_value()


@pytest.fixture(scope='module')
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f'{CHROMIUM} is missing: `make setup` installs Debian\'s chromium for the '
                    f'browser tests (apt-get install chromium)')
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def test_browser_labels_a_pending_request(browser: object, store: LabelStore) -> None:
    store.add_request(pending('req-1', reason='I don\'t know what this is <b>really</b>'))
    recorder = Recorder(store)
    config = WebConfig(port=0, poll_interval_s=0.3)
    with LabellingServer(store.pending_requests, recorder, config) as server:
        page = browser.new_page()
        try:
            page.set_default_timeout(30_000)
            page.goto(server.url)
            card = page.locator('[data-testid=request-card][data-request-id="req-1"]')
            card.wait_for()
            # The crop is really shown: loaded, with the stored PNG's size.
            crop = card.locator('[data-testid=crop]')
            crop.wait_for()
            page.wait_for_function(
                "img => img.complete && img.naturalWidth > 0",
                arg=crop.element_handle())
            assert crop.evaluate('img => [img.naturalWidth, img.naturalHeight]') == [32, 24]
            # Text from the robot is shown as text, never as markup.
            assert card.locator('[data-testid=reason]').inner_text() == (
                'I don\'t know what this is <b>really</b>')
            assert card.locator('b').count() == 0
            buttons = card.locator('[data-testid=candidate]')
            assert buttons.all_inner_texts() == ['mug 62%', 'box 21%']

            page.fill('[data-testid=labeler]', 'tester')
            card.locator('[data-testid=candidate][data-label=mug]').click()
            assert reply(page, card) == "stored label 'mug' for request req-1 (by tester)"
            assert recorder.calls == [('req-1', 'mug', 'tester')]
            label = store.get_label('req-1')
            assert (label.label, label.labeler, label.source) == ('mug', 'tester', 'web')

            # Live update: a new request appears without a reload, the answered one goes.
            store.add_request(pending('req-2', candidates=(('box', 0.5),)))
            second = page.locator('[data-testid=request-card][data-request-id="req-2"]')
            second.wait_for()
            card.wait_for(state='detached')
            second.locator('[data-testid=new-label]').fill('  tea   pot ')
            second.locator('[data-testid=submit-new]').click()
            assert reply(page, second).startswith("stored label 'tea pot'")
            assert recorder.calls[-1] == ('req-2', 'tea pot', 'tester')
            assert store.get_label('req-2').label == 'tea pot'
            page.locator('[data-testid=empty]').wait_for(state='visible')
            assert store.pending_requests() == []
        finally:
            page.close()


# The box's outline in page pixels against where the displayed image puts those crop pixels
# (object-fit: contain: scaled by the smaller ratio, centred), read in the browser.
_OUTLINE_GEOMETRY = """([img, rect]) => {
  const i = img.getBoundingClientRect(), r = rect.getBoundingClientRect();
  const scale = Math.min(i.width / img.naturalWidth, i.height / img.naturalHeight);
  return {img: [i.left, i.top, i.width, i.height], scale: scale,
          shown: [i.left + (i.width - img.naturalWidth * scale) / 2,
                  i.top + (i.height - img.naturalHeight * scale) / 2],
          outline: [r.left, r.top, r.width, r.height],
          visible: getComputedStyle(rect).visibility === 'visible'};
}"""


@pytest.mark.parametrize(('crop_hw', 'box'), [
    ((24, 32), (4.0, 3.0, 20.0, 15.0)),      # wider than tall: fills the card's width
    ((64, 16), (2.0, 40.0, 12.0, 20.0)),     # taller than the 16rem limit: bars at the sides
    ((30, 30), (0.0, 0.0, 30.0, 30.0)),      # the whole crop
])
def test_browser_outlines_the_objects_box_on_the_crop(browser: object, store: LabelStore,
                                                      crop_hw: tuple[int, int],
                                                      box: tuple[float, ...]) -> None:
    h, w = crop_hw
    store.add_request(pending('req-box', crop_png=encode_png(crop_pixels(h, w)), box=box))
    store.add_request(pending('req-nobox', box=None))
    with LabellingServer(store.pending_requests, store_submitter(store),
                         WebConfig(port=0, poll_interval_s=0.3)) as server:
        page = browser.new_page(viewport={'width': 1000, 'height': 800})
        try:
            page.set_default_timeout(30_000)
            page.goto(server.url)
            card = page.locator('[data-request-id="req-box"]')
            crop, outline = card.locator('[data-testid=crop]'), card.locator(
                '[data-testid=crop-box]')
            outline.wait_for(state='attached')
            page.wait_for_function('img => img.complete && img.naturalWidth > 0',
                                   arg=crop.element_handle())
            for width in (1000, 420):  # the outline follows the displayed size
                page.set_viewport_size({'width': width, 'height': 800})
                g = page.evaluate(_OUTLINE_GEOMETRY,
                                  [crop.element_handle(), outline.element_handle()])
                assert g['visible']
                assert g['img'][2] > 2 * w  # shown larger than the crop: scaling is tested
                x, y, bw, bh = box
                expected = [g['shown'][0] + x * g['scale'], g['shown'][1] + y * g['scale'],
                            bw * g['scale'], bh * g['scale']]
                assert g['outline'] == pytest.approx(expected, abs=1.0), (width, g)
            # A request without a box shows its crop without an outline.
            other = page.locator('[data-request-id="req-nobox"]')
            other.locator('[data-testid=crop]').wait_for()
            assert other.locator('[data-testid=crop-box]').count() == 0
        finally:
            page.close()


def test_browser_shows_refusals_and_lost_store(browser: object, tmp_path: Path) -> None:
    store = LabelStore(tmp_path / 'refusals.sqlite3')
    store.add_request(pending('req-9'))
    failing = {'on': False}

    def provider() -> list[PendingRequest]:
        if failing['on']:
            raise LabelStoreLockedError('label store refusals.sqlite3 is locked')
        return store.pending_requests()

    def refuse(rid: str, label: str, labeler: str) -> tuple[bool, str]:
        return False, f"request {rid} is stale; '{label}' not stored"

    with LabellingServer(provider, refuse, WebConfig(port=0, poll_interval_s=0.3)) as server:
        page = browser.new_page()
        try:
            page.set_default_timeout(30_000)
            page.goto(server.url)
            card = page.locator('[data-request-id="req-9"]')
            card.locator('[data-testid=candidate][data-label=box]').click()
            assert reply(page, card, 'stale') == "request req-9 is stale; 'box' not stored"
            assert card.locator('[data-testid=candidate]').first.is_enabled()  # can retry
            failing['on'] = True
            banner = page.locator('[data-testid=banner]')
            banner.wait_for(state='visible')
            assert 'is locked' in banner.inner_text()
        finally:
            page.close()
    store.close()


def test_browser_with_token(browser: object, store: LabelStore) -> None:
    store.add_request(pending('req-t'))
    recorder = Recorder(store)
    config = WebConfig(port=0, token=TOKEN, poll_interval_s=0.3)
    with LabellingServer(store.pending_requests, recorder, config) as server:
        context = browser.new_context()
        page = context.new_page()
        try:
            page.set_default_timeout(30_000)
            response = page.goto(server.url)
            assert response.status == 401
            page.goto(f'{server.url}?token={TOKEN}')
            assert page.url == server.url  # the token left the address bar
            card = page.locator('[data-request-id="req-t"]')
            crop = card.locator('[data-testid=crop]')
            crop.wait_for()
            page.wait_for_function("img => img.complete && img.naturalWidth === 32",
                                   arg=crop.element_handle())
            card.locator('[data-testid=candidate][data-label=box]').click()
            assert reply(page, card).startswith("stored label 'box'")
            assert recorder.calls == [('req-t', 'box', 'web')]
            assert store.get_label('req-t').label == 'box'
        finally:
            context.close()


def test_browser_shows_a_fleets_requests_with_a_filter_by_robot(browser: object,
                                                                 postgres_url: str) -> None:
    from uq_autonomy.labels.url import open_label_store

    with open_label_store(postgres_url) as fleet:
        for rid, robot in (('a-1', 'robot-a'), ('b-1', 'robot-b'), ('a-2', 'robot-a')):
            fleet.add_request(pending(rid, robot_id=robot))
        config = WebConfig(port=0, poll_interval_s=0.3)
        with LabellingServer(fleet.pending_requests, store_submitter(fleet), config) as server:
            page = browser.new_page()
            try:
                page.set_default_timeout(30_000)
                page.goto(server.url)
                cards = page.locator('[data-testid=request-card]')
                page.wait_for_function('n => document.querySelectorAll('
                                       '"[data-testid=request-card]").length === n', arg=3)
                assert cards.locator('[data-testid=robot]').all_inner_texts() == [
                    'robot robot-a', 'robot robot-b', 'robot robot-a']
                page.select_option('[data-testid=robot-filter]', 'robot-b')
                page.wait_for_function('n => document.querySelectorAll('
                                       '"[data-testid=request-card]").length === n', arg=1)
                card = cards.first
                assert card.get_attribute('data-request-id') == 'b-1'
                card.locator('[data-testid=candidate][data-label=box]').click()
                assert reply(page, card).startswith("stored label 'box' for request b-1")
                page.select_option('[data-testid=robot-filter]', '')
                page.wait_for_function('n => document.querySelectorAll('
                                       '"[data-testid=request-card]").length === n', arg=2)
            finally:
                page.close()
        label = fleet.get_label('b-1')
        assert (label.label, label.robot_id, label.source) == ('box', 'robot-b', 'web')
        assert [r.request_id for r in fleet.pending_requests()] == ['a-1', 'a-2']
