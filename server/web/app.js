/* potserve's page: documents into sessions (streamed in numbered chunks,
 * resumable), chat over them, and the map of what each session's memory pot
 * keeps. Plain DOM; model output is never parsed as HTML: its markdown becomes
 * elements built around text nodes, a link's href only an http(s) URL. */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  // upload chunk size (cut back to a UTF-8 boundary), or the server's max_chunk_bytes if smaller. The server
  // streams a chunk's progress once it has read its body, and reads at most 128 KiB ahead of the engine:
  // a chunk of 64 KiB is read at once, so its progress shows from its start.
  const CHUNK_BYTES = 64 * 1024;
  const KEY_STORE = 'potserve.key';        // sessionStorage: this tab only
  const UPLOAD_STORE = 'potserve.upload';  // localStorage: the session an upload is filling
  const nf = new Intl.NumberFormat();

  const state = {
    server: null,        // GET /v1/server
    sessions: [],
    selected: null,      // session id
    upload: null,        // this tab's upload (see runUpload): running, finished or stopped
    remote: null,        // the session another tab is uploading to (see followOtherTab)
    chat: [],            // {role, content}
    chatAbort: null,
    chatNumber: 0,       // which conversation this is (an answer ending later joins only its own)
    chatOverChosen: false, // the user picked "Ask over" (plain chat too): it no longer follows the selection
    map: null,           // last retention answer and its geometry
  };

  // ---- messages -------------------------------------------------------------------------

  // A message at the foot of the window. It covers no control for good: clicks go through it but for
  // its ×, and it goes by itself (an info after 6 s, an error after 20 s) unless `stay`. Returns it.
  function say(text, kind, stay) {
    const box = document.createElement('div');
    box.className = 'msg ' + (kind || 'error');
    box.setAttribute('role', kind === 'info' ? 'status' : 'alert');
    const span = document.createElement('span');
    span.textContent = text;
    const close = document.createElement('button');
    close.type = 'button';
    close.className = 'ghost';
    close.textContent = '×';
    close.setAttribute('aria-label', 'Dismiss');
    close.addEventListener('click', () => box.remove());
    box.append(span, close);
    $('messages').append(box);
    if (!stay) setTimeout(() => box.remove(), kind === 'info' ? 6000 : 20000);
    while ($('messages').children.length > 4) $('messages').firstChild.remove();
    return box;
  }

  // ---- the API ------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const e = body && body.error ? body.error : {};
      super(e.message || ('HTTP ' + status));
      this.status = status;
      this.code = e.code || null;
      this.retryAfter = Number(e.retry_after) || 0; // seconds, a streamed 503's (as Retry-After would say)
    }
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  let keyWaiters = [];
  function askKey(message) {
    $('key-error').hidden = !message;
    $('key-error').textContent = message || '';
    $('key-button').hidden = false;
    if (!$('key-dialog').open) $('key-dialog').showModal();
    return new Promise((resolve) => keyWaiters.push(resolve));
  }

  // fetch with the key; 401 asks for a key and tries again; other errors throw ApiError.
  async function api(path, opts) {
    opts = opts || {};
    for (;;) {
      const init = Object.assign({}, opts, { headers: headers(opts.headers) });
      if (opts.json !== undefined) {
        init.body = JSON.stringify(opts.json);
        init.headers['Content-Type'] = 'application/json';
      }
      let r;
      try {
        r = await fetch(path, init);
      } catch (e) { // no answer at all ("Failed to fetch"): say what that means; a cancel stays a cancel
        if (e.name === 'AbortError') throw e;
        throw new Error('No answer from the server: it is stopped or out of reach (' + e.message + ')');
      }
      if (r.status === 401) {
        const had = sessionStorage.getItem(KEY_STORE);
        await askKey(had ? 'The server refused that key.' : '');
        continue;
      }
      if (opts.raw && r.ok) return r;
      const text = await r.text();
      let body = null;
      try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
      if (!r.ok) {
        const e = new ApiError(r.status, body || { error: { message: text.trim() || r.statusText } });
        e.retryAfter = Number(r.headers.get('Retry-After')) || e.retryAfter;
        throw e;
      }
      return body;
    }
  }

  // Server-sent events of a fetch response: onEvent(name, data) per event, onComment(line) per
  // comment line (the server's progress notes, keep-alives) when given.
  async function readEvents(response, onEvent, onComment) {
    const reader = response.body.getReader();
    const dec = new TextDecoder();
    let buf = '', name = 'message', data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '');
        buf = buf.slice(nl + 1);
        if (line === '') {
          if (data.length) onEvent(name, data.join('\n'));
          name = 'message';
          data = [];
        } else if (line.startsWith(':')) {
          if (onComment) onComment(line);
        } else if (line.startsWith('event:')) {
          name = line.slice(6).trim();
        } else if (line.startsWith('data:')) {
          data.push(line.slice(5).replace(/^ /, ''));
        }
      }
    }
    if (data.length) onEvent(name, data.join('\n'));
  }

  // ---- formatting -----------------------------------------------------------------------------

  function bytes(n) {
    if (n < 1024) return n + ' B';
    const u = ['KiB', 'MiB', 'GiB'];
    let i = -1;
    do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
    return n.toFixed(n < 10 ? 1 : 0) + ' ' + u[i];
  }

  function duration(s) {
    if (!isFinite(s) || s < 0) return '–';
    if (s < 60) return Math.ceil(s) + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
  }

  function ago(t) {
    const s = Date.now() / 1000 - t;
    if (s < 60) return 'just now';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return new Date(t * 1000).toLocaleDateString();
  }

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }

  function fillStats(dl, pairs) {
    dl.replaceChildren(...pairs.map(([k, v, id]) => {
      const dd = el('dd', { text: v });
      if (id) dd.id = id;
      return el('div', null, el('dt', { text: k }), dd);
    }));
  }

  const title = (s) => (s.metadata && typeof s.metadata.title === 'string' && s.metadata.title) || s.id;

  // ---- tabs ------------------------------------------------------------------------------------

  const tabs = ['doc', 'chat', 'map'];
  function showTab(name, focus) {
    for (const t of tabs) {
      const on = t === name;
      $('tab-' + t).setAttribute('aria-selected', on);
      $('tab-' + t).tabIndex = on ? 0 : -1;
      $('panel-' + t).hidden = !on;
    }
    if (focus) $('tab-' + name).focus();
    if (name === 'map') loadMap();
  }
  for (const t of tabs) {
    $('tab-' + t).addEventListener('click', () => showTab(t));
    $('tab-' + t).addEventListener('keydown', (ev) => {
      const i = tabs.indexOf(t);
      if (ev.key === 'ArrowRight') showTab(tabs[(i + 1) % tabs.length], true);
      else if (ev.key === 'ArrowLeft') showTab(tabs[(i + tabs.length - 1) % tabs.length], true);
      else return;
      ev.preventDefault();
    });
  }
  const currentTab = () => tabs.find((t) => !$('panel-' + t).hidden);

  // ---- sessions ------------------------------------------------------------------------------------

  // Lists come back out of order (a poll's and a refresh's): one older than the list shown is dropped, or a
  // session just picked could vanish from the page again, its selection with it.
  let listAsked = 0, listShown = 0;
  async function loadSessions() {
    const asked = ++listAsked;
    const list = await api('/v1/sessions');
    if (asked < listShown) return;
    listShown = asked;
    state.sessions = list.data.sort((a, b) => b.created - a.created);
    if (state.selected && !state.sessions.some((s) => s.id === state.selected)) state.selected = null;
    renderSessions();
    if (state.remote) showRemote();
  }

  function renderSessions() {
    if (state.map && state.map.ret.id !== state.selected) clearMap();
    const ul = $('sessions');
    // the list is built anew (at each poll, each chunk): a focused item keeps the focus, and one gone
    // (deleted) hands it to the item in its place, or to "+ New document"
    const focused = document.activeElement, was = focused && focused.closest('#sessions li');
    const at = was ? [...ul.children].indexOf(was) : -1, part = focused && focused.classList.contains('del') ? '.del' : '.pick';
    ul.replaceChildren(...state.sessions.map((s) => {
      const pick = el('button', { type: 'button', class: 'pick', 'aria-pressed': s.id === state.selected },
        el('span', { class: 'name', text: title(s) }),
        // (a cluster's list shows the sessions other replicas hold as "stored", without their tokens)
        el('span', { class: 'meta', text: [bytes(s.bytes_received),
          s.tokens_ingested == null ? null : nf.format(s.tokens_ingested) + ' tokens',
          s.status + (s.final ? '' : s.bytes_received ? ', open' : ''), ago(s.created)].filter((x) => x).join(' · ') }));
      pick.addEventListener('click', () => select(s.id));
      const del = el('button', { type: 'button', class: 'ghost del', 'aria-label': 'Delete ' + title(s), title: 'Delete' });
      del.textContent = '×';
      del.addEventListener('click', () => removeSession(s));
      if (s.id === state.remote) { del.disabled = true; del.title = 'Being uploaded in another tab'; }
      const li = el('li', { 'data-id': s.id }, pick, del);
      if (s.id === state.selected) li.classList.add('selected');
      return li;
    }));
    if (was) {
      const same = [...ul.children].find((li) => li.dataset.id === was.dataset.id);
      const li = same || ul.children[Math.min(at, ul.children.length - 1)];
      (li ? li.querySelector(same ? part : '.pick') : $('new-doc')).focus({ preventScroll: true });
    }
    $('sessions-empty').hidden = state.sessions.length > 0;
    renderCurrent();
    renderChatOver();
  }

  function select(id) {
    state.selected = id;
    renderSessions();
    if (currentTab() === 'map') loadMap();
  }

  function renderCurrent() {
    const s = state.sessions.find((x) => x.id === state.selected);
    $('current').hidden = !s;
    if (!s) return;
    $('current-title').textContent = title(s);
    $('current-status').textContent = s.status + (s.final ? '' : ' (document open)');
    $('current-status').dataset.status = s.status;
    const pairs = [
      ['Tokens read', nf.format(s.tokens_ingested)], ['In the pot', nf.format(s.tokens_in_pot) + ' of ' + nf.format(s.budget_tokens)],
      ['Compressions', nf.format(s.compressions)], ['Bytes', bytes(s.bytes_received)],
      ['Policy', s.policy + ' · ' + s.schedule], ['Keep', nf.format(s.keep_tokens)],
      ['Chunks', nf.format(s.last_seq)], ['Created', new Date(s.created * 1000).toLocaleString()],
    ];
    if (s.error) pairs.push(['Error', s.error]);
    fillStats($('current-stats'), pairs);
  }

  // DELETE, asked again for up to two minutes while the session answers 409 session_busy (the server
  // ends a chunk whose body it has whole, after an upload cancelled, or puts a refused one back; onBusy
  // is called once then): true once deleted.
  async function deleteSession(id, onBusy) {
    const until = Date.now() + 120000;
    for (let i = 0; ; i++) {
      try {
        await api('/v1/sessions/' + id, { method: 'DELETE' });
        if (state.selected === id) state.selected = null;
        return true;
      } catch (err) {
        if (err.code !== 'session_busy' || Date.now() > until) throw err;
        if (i === 0 && onBusy) onBusy();
        await sleep(500);
      }
    }
  }

  async function removeSession(s) {
    if (!confirm('Delete "' + title(s) + '"? Its document and memory pot are removed.')) return;
    const u = state.upload; // this tab's upload into it ends first (else its chunk holds the session)
    if (u && u.id === s.id && !u.remote) await cancelUpload();
    try {
      await deleteSession(s.id, () => say('Deleting ' + title(s) + ' once the server has read the chunk it holds.', 'info'));
      say('Deleted ' + title(s) + '.', 'info');
      await loadSessions();
    } catch (e) { say(e.message); }
  }

  // ---- the server's defaults -----------------------------------------------------------------------

  // GET /v1/server, fetched again where the page has it not (it was opened while the server was down or
  // draining): what needs the model's name or the session defaults waits for it.
  async function serverInfo() {
    if (!state.server) {
      state.server = await api('/v1/server');
      renderDefaults();
    }
    return state.server;
  }

  function renderDefaults() {
    const d = state.server.session_defaults;
    const opts = (sel, names, dflt) => sel.replaceChildren(...names.map((n) =>
      el('option', { value: n, text: n + (n === dflt ? ' (default)' : '') })));
    opts($('set-policy'), state.server.policies, d.policy);
    opts($('set-schedule'), state.server.schedules, d.schedule);
    $('set-policy').value = d.policy;
    $('set-schedule').value = d.schedule;
    $('set-budget').placeholder = d.budget_tokens;
    $('set-budget').max = state.server.context_length;
    $('set-keep').placeholder = 'budget / 2';
    $('defaults-note').textContent = 'Server defaults: ' + d.policy + ', budget ' + nf.format(d.budget_tokens) +
      ' tokens, keep half after each compression, ' + d.schedule + ' schedule. Empty fields take the default.';
    $('model').textContent = state.server.model;
  }

  // ---- uploads ------------------------------------------------------------------------------------------
  // A document goes up in chunks of about CHUNK_BYTES (less where the server's
  // max_chunk_bytes is smaller), each cut back to a UTF-8 character boundary,
  // numbered 1, 2, ... (X-Chunk-Seq). The file and its chunk size are kept in
  // the browser, so after a reload or a lost connection the page continues
  // from the session's last_seq and bytes_received. A server whose
  // max_chunk_bytes went down meanwhile (413 chunk_too_large) gets smaller chunks.

  // The document itself survives a reload in IndexedDB (Blobs are kept as they are).
  function idb() {
    return new Promise((resolve, reject) => {
      const rq = indexedDB.open('potserve', 1);
      rq.onupgradeneeded = () => rq.result.createObjectStore('uploads');
      rq.onsuccess = () => resolve(rq.result);
      rq.onerror = () => reject(rq.error);
    });
  }
  async function idbDo(mode, fn) {
    const db = await idb();
    return new Promise((resolve, reject) => {
      const tx = db.transaction('uploads', mode);
      const rq = fn(tx.objectStore('uploads'));
      tx.oncomplete = () => resolve(rq && rq.result);
      tx.onerror = () => reject(tx.error);
    });
  }
  const saveDoc = (id, rec) => idbDo('readwrite', (s) => s.put(rec, id)).catch(() => null);
  const loadDoc = (id) => idbDo('readonly', (s) => s.get(id)).catch(() => null);
  const dropDoc = (id) => idbDo('readwrite', (s) => s.delete(id)).catch(() => null);

  // End of the chunk starting at `start` (a character boundary): start + chunkBytes, moved back off
  // UTF-8 continuation bytes. A chunk size too small for the character at `start` is an error: the
  // chunk would be empty, and the server takes an empty chunk without the upload moving on.
  async function chunkEnd(blob, start, chunkBytes) {
    let end = Math.min(blob.size, start + chunkBytes);
    if (end === blob.size) return end;
    const from = Math.max(start, end - 3);       // a character's first byte is at most 3 bytes back
    const b = new Uint8Array(await blob.slice(from, end + 1).arrayBuffer());
    let i = end - from;                           // b[i]: the byte at end, the next chunk's first
    while (i > 0 && (b[i] & 0xC0) === 0x80) i--, end--;
    if (end === start) {
      throw new Error('the server takes chunks of at most ' + nf.format(chunkBytes) + ' bytes (its max_chunk_bytes), ' +
        'too few for the character at byte ' + nf.format(start) + ' of this document (UTF-8 characters take up to 4)');
    }
    return end;
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  // Only one tab drives an upload. Tabs of a browser share localStorage and IndexedDB, so a tab opened
  // while another uploads would otherwise resume the same upload and race it. The driving tab holds a
  // Web Lock named after the session, which the browser frees when that tab closes or crashes.
  // Resolves with a function that lets the lock go, or with null when another tab holds it and `wait`
  // is false. Without Web Locks (a page from another host over plain http is not a secure context)
  // there is no guard.
  const lockName = (id) => 'potserve.upload.' + id;
  function holdUpload(id, wait) {
    if (!navigator.locks) return Promise.resolve(() => {});
    return new Promise((resolve, reject) => {
      navigator.locks.request(lockName(id), wait ? {} : { ifAvailable: true }, (lock) => {
        if (!lock) return resolve(null);
        return new Promise((release) => resolve(release)); // held until release() is called
      }).catch(reject);
    });
  }

  // Whether a tab holds the upload to session id (asked where this tab does not: then it is another).
  async function heldElsewhere(id) {
    if (!navigator.locks) return false;
    const { held } = await navigator.locks.query();
    return held.some((l) => l.name === lockName(id));
  }

  const uploading = () => !!(state.upload && !state.upload.finished && !state.upload.stopped);

  async function startUpload(ev) {
    ev.preventDefault();
    if (uploading()) return say('An upload is already running; cancel it first.');
    const pending = localStorage.getItem(UPLOAD_STORE);
    if (state.remote || pending && await heldElsewhere(pending))
      return say('Another tab of this browser is uploading a document; wait for it to end, or cancel it there.');
    const file = $('file').files[0] || null, pasted = $('paste').value;
    let blob = file, name = file ? file.name : '';
    if (!file && pasted.trim()) {
      blob = new Blob([pasted], { type: 'text/plain' });
      name = pasted.trim().split('\n')[0].slice(0, 40) || 'Pasted text';
    }
    if (!blob) return say('Choose a file or paste some text first.');
    if (blob.size === 0) return say('That document is empty.');
    // UTF-16 without a byte order mark is valid UTF-8 to the server (its NULs are characters): refused
    // here, as a binary file is, rather than read as text full of NULs
    if (new Uint8Array(await blob.slice(0, 1024).arrayBuffer()).includes(0)) {
      return say('Not read: ' + name + ' holds NUL bytes (a binary file, or UTF-16). This page reads UTF-8 text ' +
        'only: save the file as UTF-8 and read it again.');
    }
    $('start').disabled = true; // (this takes the focus off it: it goes to the progress, or back here)
    let started = false;
    try {
      const srv = await serverInfo();
      const settings = { metadata: { title: name, bytes: blob.size } };
      const d = srv.session_defaults;
      if ($('set-policy').value !== d.policy) settings.policy = $('set-policy').value;
      if ($('set-schedule').value !== d.schedule) settings.schedule = $('set-schedule').value;
      if ($('set-budget').value) settings.budget_tokens = Number($('set-budget').value);
      if ($('set-keep').value) settings.keep_tokens = Number($('set-keep').value);
      const s = await api('/v1/sessions', { method: 'POST', json: settings });
      const release = await holdUpload(s.id, false) || (() => {}); // a new session: no other tab holds it
      const old = localStorage.getItem(UPLOAD_STORE); // a stopped upload's kept file: this one replaces it
      if (old) dropDoc(old);
      localStorage.setItem(UPLOAD_STORE, s.id);
      const rec = { blob, name, chunkBytes: Math.min(CHUNK_BYTES, srv.max_chunk_bytes) };
      await saveDoc(s.id, rec);
      if (file) { // what was read is emptied, not the other
        $('file').value = '';
        $('drop-text').replaceChildren(el('strong', { text: 'Drop a text file here' }), ' or press to choose one');
        if (pasted.trim()) say('Reading ' + name + ', the file chosen; the pasted text stays in its box, to read next.', 'info');
      } else {
        $('paste').value = '';
      }
      state.selected = s.id;
      await loadSessions();
      runUpload(s, rec, release);
      started = true;
    } catch (e) {
      say('Could not start: ' + e.message);
    } finally {
      $('start').disabled = false;
      (started ? $('upload') : $('start')).focus();
    }
  }

  function showUpload(u) {
    $('upload').hidden = !u;
    if (!u) return;
    $('upload-title').textContent = (u.finished ? 'Read ' : 'Reading ') + u.name + (u.remote ? ' in another tab' : '');
    const frac = Math.min(1, u.doneFraction);
    $('upload-fill').style.width = (frac * 100).toFixed(1) + '%';
    $('upload-bar').setAttribute('aria-valuenow', Math.round(frac * 100));
    $('upload').dataset.done = u.finished ? 'true' : 'false';
    $('up-tokens').textContent = nf.format(u.tokens) + (u.finished ? '' : ' of ~' + nf.format(Math.round(u.estTotal)));
    $('up-pot').textContent = nf.format(u.pot);
    $('up-comp').textContent = nf.format(u.comp);
    $('up-rate').textContent = u.rate ? nf.format(Math.round(u.rate)) + ' tokens/s' : '–';
    $('up-eta').textContent = u.finished ? 'done' : u.rate ? duration((u.estTotal - u.tokens) / u.rate) : '–';
    // a finished upload, or a stopped one whose file is gone, has nothing left to cancel; another tab's
    // upload is that tab's to cancel
    $('upload-cancel').textContent = u.finished || u.stopped && !u.kept ? 'Close' : 'Cancel';
    $('upload-cancel').hidden = !!u.remote;
  }

  // Sends the document from where the session stands; retries after network errors. `release` lets
  // go of this tab's hold on the upload (holdUpload).
  async function runUpload(session, rec, release) {
    const { blob, name } = rec;
    let chunkBytes = rec.chunkBytes || CHUNK_BYTES; // pages before max_chunk_bytes kept none
    const u = {
      id: session.id, name, blob, abort: null, cancelled: false, finished: false, stopped: false, kept: false,
      tokens: session.tokens_ingested, pot: session.tokens_in_pot, comp: session.compressions,
      pinned: session.pinned_tokens, rate: 0, estTotal: blob.size / 4, doneFraction: 0, t0: performance.now(),
    };
    state.upload = u;
    $('upload-note').textContent = ''; // the last upload's "Done" or "Stopped" is not this one's
    showUpload(u);
    let failures = 0;
    let seq = session.last_seq, offset = session.bytes_received;
    try {
      if (offset > blob.size)
        throw new Error('this document does not match what the session has read (' + bytes(offset) + ')');
      if (seq) {
        $('upload-note').textContent = 'Resumed after chunk ' + seq + ' (' + bytes(offset) + ' already read).';
        $('upload').dataset.resumedAfter = seq;
      } else {
        delete $('upload').dataset.resumedAfter;
      }
      while (!u.cancelled) {
        const end = await chunkEnd(blob, offset, chunkBytes);
        const final = end === blob.size;
        try {
          const res = await sendChunk(u, seq + 1, blob.slice(offset, end), final, offset);
          failures = 0;
          seq = res.last_seq;
          offset = end;
          if (res.final || final) break;
        } catch (e) {
          if (u.cancelled) break;
          if (e instanceof ApiError && e.code === 'seq_gap') { // someone else moved on: resync
            const s = await api('/v1/sessions/' + u.id);
            seq = s.last_seq;
            offset = s.bytes_received;
            continue;
          }
          if (e instanceof ApiError && e.code === 'chunk_too_large') {
            // The server's max_chunk_bytes went down (a restart with a smaller one): cut to its new
            // limit, or halve where that is not known, and keep the size for a reload.
            const srv = await api('/v1/server').catch(() => null);
            const limit = srv ? srv.max_chunk_bytes : 0;
            const smaller = limit > 0 && limit < chunkBytes ? limit : Math.floor(chunkBytes / 2);
            if (smaller < 1) throw e;
            chunkBytes = smaller;
            if (srv) state.server.max_chunk_bytes = srv.max_chunk_bytes;
            await saveDoc(u.id, { blob, name, chunkBytes });
            $('upload-note').textContent = 'The server now takes chunks of at most ' + bytes(chunkBytes) +
              '; going on in chunks of that size.';
            continue;
          }
          const transient = !(e instanceof ApiError) || e.status === 409 && e.code === 'session_busy' ||
            e.status === 503 || e.status === 429 || e.code === 'client_closed';
          if (!transient) throw e;
          failures++;
          const wait = Math.max(1000 * (e.retryAfter || 0), Math.min(15000, 500 * 2 ** Math.min(failures, 5)));
          $('upload-note').textContent = (e instanceof ApiError ? e.message : 'Connection lost') +
            ' — retrying in ' + Math.round(wait / 1000) + ' s…';
          await sleep(wait);
        }
      }
      if (!u.cancelled) {
        u.finished = true;
        u.doneFraction = 1;
        const secs = (performance.now() - u.t0) / 1000;
        $('upload-note').textContent = 'Done: ' + nf.format(u.tokens) + ' tokens read in ' + duration(secs) + '; ' + potNote(u);
        say('Finished reading ' + name + '.', 'info');
      }
    } catch (e) {
      await uploadStopped(u, e);
    } finally {
      if (!u.cancelled) showUpload(u);
      if (u.finished || u.stopped && !u.kept) {
        localStorage.removeItem(UPLOAD_STORE);
        dropDoc(u.id);
      }
      release(); // after the record went: a tab waiting for this upload then finds it over
      loadSessions().catch((e) => say(e.message));
      if (currentTab() === 'map' && state.selected === u.id) loadMap();
    }
  }

  // What the pot holds after a document: its share of the document, and the pinned prefix (the chat
  // template's start and the system prompt, the session's pinned_tokens) beside it.
  function potNote(u) {
    return 'the pot keeps ' + nf.format(u.pot - u.pinned) + ' of them' + (u.pinned ? ', beside ' + nf.format(u.pinned) +
      ' pinned tokens (the chat template\'s start and the system prompt).' : '.');
  }

  // An upload that cannot go on. The file is kept for a later try (the page opened again carries on)
  // while the session can still take it: after a server error (5xx), not after the server refused these
  // bytes (a 4xx: it would again) or the page could not cut them, nor when the session is gone, failed or
  // ended. Otherwise the session the page made for this document is deleted if it took nothing of it,
  // rather than left empty in the list.
  async function uploadStopped(u, e) {
    u.stopped = true;
    let s, removed = false;
    try { s = await api('/v1/sessions/' + u.id); } catch (err) { s = err.status === 404 ? null : undefined; }
    u.kept = s !== null && !(s && (s.final || s.status === 'failed')) && e instanceof ApiError && e.status >= 500;
    if (!u.kept && s && s.last_seq === 0 && s.bytes_received === 0 && !s.final) {
      // (while the server undoes the refused chunk, the session is busy; if it stays, empty, the
      // list offers to delete it)
      removed = await deleteSession(u.id).catch(() => false);
    }
    let msg = e.message + (removed ? ' (the empty session was removed)' : '');
    if (e.code === 'invalid_utf8') msg += '. This page reads UTF-8 text only: save the file as UTF-8 and read it again';
    if (u.kept) msg += '. The file is kept: the upload goes on when this page is opened again';
    say('Upload of ' + u.name + ' stopped: ' + msg);
    $('upload-note').textContent = 'Stopped: ' + msg;
  }

  // One chunk with its progress events; resolves with the session after it.
  async function sendChunk(u, seq, body, final, offset) {
    u.abort = new AbortController();
    const tokens0 = u.tokens, t0 = performance.now();
    let last = { t: t0, tokens: u.tokens }, result = null, error = null;
    const perByte = u.tokensPerByte || 0.25;
    const r = await api('/v1/sessions/' + u.id + '/chunks' + (final ? '?final=true' : ''), {
      method: 'POST', raw: true, signal: u.abort.signal, body,
      headers: { 'Content-Type': 'text/plain; charset=utf-8', 'X-Chunk-Seq': String(seq), Accept: 'text/event-stream' },
    });
    if (!(r.headers.get('Content-Type') || '').startsWith('text/event-stream')) {
      result = await r.json(); // plain JSON: how servers before 2026-12 answered a duplicate
    } else {
      await readEvents(r, (name, data) => {
        const d = JSON.parse(data);
        // the 200 is already sent: the error object carries the status the answer would have had, a 4xx a
        // refusal, a 5xx (the server stopping, a full disk) a failure to retry (docs/api.md)
        if (name === 'error') { error = new ApiError((d.error && d.error.status) || 500, d); return; }
        if (name === 'done') { result = d; return; }
        const now = performance.now();
        if (now > last.t && d.tokens_ingested > last.tokens) {
          const inst = (d.tokens_ingested - last.tokens) / ((now - last.t) / 1000);
          u.rate = u.rate ? 0.7 * u.rate + 0.3 * inst : inst;
        }
        last = { t: now, tokens: d.tokens_ingested };
        u.tokens = d.tokens_ingested; u.pot = d.tokens_in_pot; u.comp = d.compressions;
        const within = Math.min(1, (u.tokens - tokens0) / (body.size * perByte));
        u.estTotal = Math.max(u.tokens, u.tokens + (u.blob.size - offset - body.size * within) * perByte);
        u.doneFraction = (offset + body.size * within) / u.blob.size;
        showUpload(u);
        liveMap(u.id);
      });
    }
    if (error) throw error;
    if (!result) throw new Error('the connection closed before the chunk was acknowledged');
    if (result.bytes_received) u.tokensPerByte = result.tokens_ingested / result.bytes_received;
    u.tokens = result.tokens_ingested; u.pot = result.tokens_in_pot; u.comp = result.compressions;
    u.doneFraction = (offset + body.size) / u.blob.size;
    u.estTotal = Math.max(u.tokens, u.tokens + (u.blob.size - offset - body.size) * (u.tokensPerByte || perByte));
    $('upload-note').textContent = 'Chunk ' + seq + ' stored (' + bytes(offset + body.size) + ' of ' + bytes(u.blob.size) + ').';
    showUpload(u);
    updateSession(result);
    liveMap(u.id);
    return result;
  }

  function updateSession(s) {
    const i = state.sessions.findIndex((x) => x.id === s.id);
    if (i < 0) return;
    state.sessions[i] = Object.assign({}, state.sessions[i], s);
    renderSessions();
  }

  async function cancelUpload() {
    const u = state.upload;
    state.upload = null;
    showUpload(null);
    if (!u || u.finished || u.stopped && !u.kept) return; // "Close": nothing left to cancel
    // a stopped upload whose kept file another tab has taken up since: that tab's to cancel
    if (u.stopped && await heldElsewhere(u.id)) return say('Another tab carries this upload on; cancel it there.', 'info');
    u.cancelled = true;
    if (u.abort) u.abort.abort();
    localStorage.removeItem(UPLOAD_STORE);
    dropDoc(u.id);
    say('Upload cancelled; the session keeps what it had read.', 'info');
  }

  // After a reload: carry on with the upload this browser left unfinished, unless another tab is
  // sending it (then follow it from here).
  async function resumeUpload() {
    const id = localStorage.getItem(UPLOAD_STORE);
    if (!id || uploading()) return; // (this tab started one since it was opened)
    const release = await holdUpload(id, false);
    if (!release) {
      followOtherTab(id).catch((e) => say(e.message));
      return;
    }
    let handed = false;
    try {
      const rec = await loadDoc(id);
      let s = null;
      try { s = await api('/v1/sessions/' + id); } catch (e) { if (e.status !== 404) throw e; }
      if (!s || !rec || s.final) {
        localStorage.removeItem(UPLOAD_STORE);
        dropDoc(id);
        if (s && !rec) say('An upload to ' + title(s) + ' was interrupted and its file is no longer here; the session keeps what it read.');
        return;
      }
      for (let i = 0; s.status === 'ingesting' && i < 60; i++) { // the interrupted chunk is being undone
        await sleep(500);
        s = await api('/v1/sessions/' + id);
      }
      state.selected = id;
      renderSessions();
      say('Resuming the upload of ' + rec.name + ' after chunk ' + s.last_seq + '.', 'info');
      runUpload(s, rec, release);
      handed = true;
    } finally {
      if (!handed) release();
    }
  }

  // Another tab sends the upload: show how far it got, offer nothing that would break it (no Cancel,
  // no Delete), and take it over once that tab lets go: closed or crashed (the upload is still
  // recorded) or done (it is not).
  async function followOtherTab(id) {
    state.remote = id;
    state.selected = id;
    renderSessions();
    showRemote();
    const release = await holdUpload(id, true);
    release();
    state.remote = null;
    showUpload(null);
    await loadSessions();
    await resumeUpload();
  }

  // The other tab's upload as the session list tells it (refreshed every 10 s).
  function showRemote() {
    const s = state.sessions.find((x) => x.id === state.remote);
    if (!s) return;
    const size = (s.metadata && s.metadata.bytes) || 0;
    const perByte = s.bytes_received ? s.tokens_ingested / s.bytes_received : 0.25;
    showUpload({ remote: true, name: title(s), finished: false, doneFraction: size ? s.bytes_received / size : 0,
      tokens: s.tokens_ingested, estTotal: Math.max(s.tokens_ingested, size * perByte), pot: s.tokens_in_pot,
      comp: s.compressions, rate: 0 });
    $('upload-note').textContent = 'Another tab of this browser is sending this document; ' +
      'this tab carries on with it if that tab is closed.';
  }

  // drag and drop
  const drop = $('drop');
  drop.addEventListener('dragover', (ev) => { ev.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (ev) => {
    ev.preventDefault();
    drop.classList.remove('over');
    const files = ev.dataTransfer.files;
    if (files.length) {
      $('file').files = files;
      pickedFile();
    }
    if (files.length > 1) say(files.length + ' files dropped: only the first, ' + files[0].name + ', is read. Drop the others one at a time.', 'info');
  });
  function pickedFile() {
    const f = $('file').files[0];
    if (f) $('drop-text').replaceChildren(el('strong', { text: f.name }), ' · ' + bytes(f.size));
  }
  $('file').addEventListener('change', pickedFile);
  $('doc-form').addEventListener('submit', startUpload);
  $('upload-cancel').addEventListener('click', cancelUpload);
  $('new-doc').addEventListener('click', () => { showTab('doc'); $('file').focus(); });

  // ---- markdown, rendered as DOM nodes (no HTML from the model is ever parsed) ----------------------------

  // Code, bold, italics and links. Emphasis is CommonMark's: never next to a space on its inner side
  // (2 * 3 * 4, *.tmp and *.log, x ** 2 keep their asterisks), and `_` neither opens nor closes inside
  // a word (max_chunk_bytes stays as it is); bold may hold italics. The search runs over the whole
  // text (lastIndex), so that the look-behind sees the character before a match.
  function inline(text, parent) {
    const re = /(`[^`\n]+`)|(\*\*(?!\s)(?:[^*\n]|\*(?!\*))+?(?<!\s)\*\*)|(\*(?![\s*])[^*\n]*?[^\s*]\*|\*[^\s*]\*|(?<![\p{L}\p{N}_])_(?!\s)[^_\n]+?(?<!\s)_(?![\p{L}\p{N}_]))|(\[[^\]\n]+\]\((https?:\/\/[^)\s]+)\))/gu;
    let at = 0, m;
    while ((m = re.exec(text))) {
      if (m.index > at) parent.append(text.slice(at, m.index));
      at = re.lastIndex;
      const t = m[0];
      if (m[1]) parent.append(el('code', { text: t.slice(1, -1) }));
      else if (m[2]) parent.append(inline(t.slice(2, -2), el('strong')));
      else if (m[3]) parent.append(inline(t.slice(1, -1), el('em')));
      else {
        parent.append(inline(t.slice(1, t.indexOf('](')), el('a', { href: m[5], rel: 'noopener noreferrer nofollow', target: '_blank' })));
      }
    }
    if (at < text.length) parent.append(text.slice(at));
    return parent;
  }

  function markdown(src) {
    const out = document.createDocumentFragment();
    const lines = src.split('\n');
    let para = [], list = null;
    const flush = () => {
      if (para.length) out.append(inline(para.join(' '), el('p')));
      para = [];
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      let m;
      if (/^\s*```/.test(line)) {
        flush();
        const code = [];
        for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) code.push(lines[i]);
        out.append(el('pre', null, el('code', { text: code.join('\n') })));
      } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flush();
        out.append(inline(m[2], el('h' + Math.min(6, m[1].length + 2))));
      } else if ((m = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line))) {
        const ordered = /\d/.test(m[1]);
        if (para.length) { out.append(inline(para.join(' '), el('p'))); para = []; }
        if (!list || list.ordered !== ordered) {
          list = { node: el(ordered ? 'ol' : 'ul'), ordered };
          // a list goes on from the number its first item has (items split by code or paragraphs)
          if (ordered && parseInt(m[1], 10) !== 1) list.node.start = parseInt(m[1], 10);
          out.append(list.node);
        }
        list.node.append(inline(m[2], el('li')));
      } else if ((m = /^>\s?(.*)$/.exec(line))) {
        flush();
        out.append(inline(m[1], el('blockquote')));
      } else if (!line.trim()) {
        flush();
      } else {
        list = null;
        para.push(line.trim());
      }
    }
    flush();
    return out;
  }

  // ---- chat ------------------------------------------------------------------------------------------------

  // A conversation is over one document: another document, or a new conversation, starts empty,
  // and an answer still coming is stopped (it joined the new conversation, and Send stayed off).
  function newConversation() {
    if (state.chatAbort) state.chatAbort.abort();
    state.chatNumber++;
    state.chat = [];
    $('chat-log').replaceChildren();
  }

  function renderChatOver() {
    const sel = $('chat-over');
    const before = sel.value;
    // the user's own choice stays (plain chat too); until there is one, the selected document
    const keep = state.chatOverChosen ? before : before || state.selected || '';
    const ready = state.sessions.filter((s) => s.tokens_ingested > 0 || s.id === state.selected);
    sel.replaceChildren(el('option', { value: '', text: 'no document (plain chat)' }),
      ...ready.map((s) => el('option', { value: s.id, text: title(s) })));
    sel.value = [...sel.options].some((o) => o.value === keep) ? keep : '';
    if (sel.value !== before && (state.chat.length || state.chatAbort)) newConversation(); // (its document went)
    $('chat-reread').disabled = !sel.value;
  }

  function addTurn(role, text) {
    const body = el('div', { class: 'body' });
    const turn = el('div', { class: 'turn ' + role }, el('div', { class: 'who', text: role === 'user' ? 'You' : 'potserve' }), body);
    if (role === 'user') body.textContent = text;
    $('chat-log').append(turn);
    turn.scrollIntoView({ block: 'end' });
    return { turn, body };
  }

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) { // not a secure context: select it for Ctrl+C instead
      const ta = el('textarea');
      ta.value = text;
      document.body.append(ta);
      ta.select();
      document.execCommand('copy');
      ta.remove();
    }
    button.textContent = 'Copied';
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  async function sendChat(ev) {
    ev.preventDefault();
    const q = $('chat-input').value.trim();
    if (!q || state.chatAbort) return;
    const over = $('chat-over').value;
    const temperature = Number($('chat-temp').value), maxTokens = Number($('chat-max').value);
    if (!(temperature >= 0 && temperature <= 2)) return say('Temperature must be between 0 and 2.');
    if (!(maxTokens >= 1)) return say('Max tokens must be at least 1.');
    $('chat-input').value = '';
    const number = state.chatNumber, chat = state.chat; // (a new conversation may begin meanwhile)
    state.chat.push({ role: 'user', content: q });
    addTurn('user', q);
    const { turn, body } = addTurn('assistant', '');
    turn.classList.add('streaming');
    const wantReread = over && $('chat-reread').checked;
    state.chatAbort = new AbortController();
    $('chat-stop').disabled = false;
    $('chat-send').disabled = true;
    let text = '', usage = null, finish = null, pending = false, recall = null, reread = null, failed = null;
    const log = $('chat-log');
    const paint = () => {
      pending = false;
      // the answer is followed only while the conversation is scrolled to its end: a reader who
      // scrolled up stays where they are
      const follow = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      body.replaceChildren(markdown(text));
      if (follow) log.scrollTop = log.scrollHeight;
    };
    try {
      const req = { model: (await serverInfo()).model, messages: state.chat.slice(), stream: true,
        stream_options: { include_usage: true }, temperature, max_tokens: maxTokens };
      if (over) req.session = over;
      if (wantReread) req.reread = true;
      const r = await api('/v1/chat/completions', { method: 'POST', json: req, raw: true, signal: state.chatAbort.signal });
      await readEvents(r, (name, data) => {
        if (data === '[DONE]') return;
        const d = JSON.parse(data);
        if (d.error) throw new ApiError(500, d);
        if (d.usage) usage = d.usage;
        if (d.recall) recall = d.recall; // the first chunk: the document's passages asked with (docs/api.md)
        if (d.reread) reread = d.reread; // ... or the re-read the answer comes from
        const c = d.choices && d.choices[0];
        if (!c) return;
        if (c.delta && c.delta.content) {
          text += c.delta.content;
          if (!pending) { pending = true; requestAnimationFrame(paint); }
        }
        if (c.finish_reason) finish = c.finish_reason;
      }, (line) => {
        // ": reread DONE/TOTAL bytes" while the document is read again for this question
        const m = /^: reread (\d+)\/(\d+) bytes/.exec(line);
        if (m && !text) {
          const pct = Number(m[2]) ? Math.floor(100 * Number(m[1]) / Number(m[2])) : 100;
          body.replaceChildren(el('span', { class: 'muted small reread-progress', text: 'Re-reading the document… ' + pct + ' %' }));
        }
      });
      if (!finish) throw new Error('the connection closed before the answer ended');
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else if (e.code === 'session_not_found' && over) {
        // expired (ttl_seconds) or deleted elsewhere: the list drops it now rather than at the next poll
        const s = state.sessions.find((x) => x.id === over);
        failed = 'the session ' + (s ? '"' + title(s) + '"' : over) + ' is gone (it expired or was deleted)';
        say('No answer: ' + failed + '. Ask over another document, or without one.');
        loadSessions().catch(() => {});
      } else {
        failed = e.message;
        say('The answer failed: ' + e.message);
      }
    } finally {
      paint();
      turn.classList.remove('streaming');
      if (number !== state.chatNumber) {
        // a new conversation began (another document, or "New conversation"): this answer is not its
      } else if (!text && (failed || finish === 'stopped')) {
        // a question with no answer (failed, or stopped before any text) leaves the conversation: the
        // next question is not asked after it
        chat.pop();
        turn.classList.add('failed');
        if (failed) body.replaceChildren(el('span', { class: 'muted', text: 'No answer: ' + failed + '.' }));
      } else {
        chat.push({ role: 'assistant', content: text });
      }
      const notes = [];
      // "length" is also the answer the model's window or the server's request_timeout cut short:
      // those stop before max_tokens
      if (finish === 'length') notes.push(usage && usage.completion_tokens >= maxTokens ? 'cut at max tokens'
        : usage ? 'cut short by the model\'s window or the server\'s time limit' : 'cut short');
      if (finish === 'stopped') notes.push('stopped');
      if (failed && text) { // cut off (a lost connection): not to be taken for the whole answer
        notes.push('interrupted');
        turn.classList.add('interrupted');
      }
      if (usage) {
        notes.push(nf.format(usage.completion_tokens) + ' tokens');
        const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
        if (cached) notes.push('read after ' + nf.format(cached) + ' pot entries');
      }
      if (reread) notes.push('re-read ' + nf.format(reread.tokens) + ' tokens in ' + reread.seconds.toFixed(1) + ' s');
      const n = recall ? recall.passages : 0;
      if (n) notes.push('with ' + nf.format(n) + (n === 1 ? ' passage' : ' passages') + ' of the document');
      const foot = el('div', { class: 'foot' }, el('span', { class: 'muted small', text: notes.join(' · ') }));
      turn.append(foot);
      if (n && recall.texts && recall.spans) foot.append(passagesButton(turn, recall));
      if (text) { // (a failed turn has nothing to copy)
        const copy = el('button', { type: 'button', class: 'ghost small', text: 'Copy' });
        copy.addEventListener('click', () => copyText(text, copy));
        foot.append(copy);
      }
      turn.dataset.done = 'true';
      state.chatAbort = null;
      if (document.activeElement === $('chat-stop')) $('chat-input').focus(); // Stop is about to be disabled
      $('chat-stop').disabled = true;
      $('chat-send').disabled = false;
    }
  }

  // The passages an answer was given, as text, each with where it is in the document (bytes as
  // uploaded), in the order they were put before the question: hidden until asked for.
  function passagesButton(turn, recall) {
    const list = el('ol', { class: 'passages', hidden: '' }, ...recall.texts.map((t, i) => el('li', null,
      el('div', { class: 'muted small', text: 'bytes ' + nf.format(recall.spans[i][0]) + '–' + nf.format(recall.spans[i][1]) }),
      el('blockquote', { text: t }))));
    turn.append(list);
    const button = el('button', { type: 'button', class: 'ghost small', text: 'Passages', 'aria-expanded': 'false' });
    button.addEventListener('click', () => {
      list.hidden = !list.hidden;
      button.setAttribute('aria-expanded', String(!list.hidden));
      button.textContent = list.hidden ? 'Passages' : 'Hide passages';
    });
    return button;
  }

  $('chat-form').addEventListener('submit', sendChat);
  $('chat-input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $('chat-form').requestSubmit(); }
  });
  $('chat-stop').addEventListener('click', () => state.chatAbort && state.chatAbort.abort());
  $('chat-clear').addEventListener('click', newConversation);
  $('chat-over').addEventListener('change', () => {
    state.chatOverChosen = true;
    newConversation();
    $('chat-reread').disabled = !$('chat-over').value;
  });

  // ---- the retention map ----------------------------------------------------------------------------------

  // Colour of a kept share v in [0, 1]: pale paper to deep ink through warm tones.
  const STOPS = [[247, 244, 236], [250, 205, 145], [233, 134, 86], [178, 60, 86], [92, 24, 96], [30, 12, 50]];
  // The square root spreads the small shares a long document leaves (a pot of 2K tokens over 100K).
  function colorFor(v) {
    v = Math.sqrt(Math.max(0, Math.min(1, v))) * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(v)), f = v - i;
    return STOPS[i].map((c, k) => Math.round(c + (STOPS[i + 1][k] - c) * f));
  }
  window.potserve = { colorFor };   // for tests and the curious

  function drawLegend() {
    const c = $('legend'), g = c.getContext('2d');
    for (let x = 0; x < c.width; x++) {
      g.fillStyle = 'rgb(' + colorFor(x / (c.width - 1)).join(',') + ')';
      g.fillRect(x, 0, 1, c.height);
    }
  }

  // Tokens [start, end) of bin b: the server puts token i in bin floor(i * bins / n).
  const binStart = (b, bins, n) => Math.ceil(b * n / bins);

  // The map, its numbers and a column's text are the selected session's: another one picked, or this one
  // deleted or expired, they go.
  function clearMap() {
    state.map = null;
    clearTimeout(regionTimer);
    regionSeq++; // a column's text still on its way is not shown
    $('map').hidden = true;
    $('map-stats').replaceChildren();
    $('map-empty').hidden = false;
    $('region').hidden = true;
  }

  // One request at a time; one asked for meanwhile runs when it ends (dropped, a session picked while
  // another's map was loading never showed its own).
  let mapBusy = false, mapAgain = false, mapNext = 0;
  async function loadMap() {
    const s = state.sessions.find((x) => x.id === state.selected);
    $('map-empty').hidden = !!(s && s.tokens_ingested);
    if (!s || !s.tokens_ingested) { $('map').hidden = true; $('map-stats').replaceChildren(); }
    if (!s) return;
    if (mapBusy) { mapAgain = true; return; }
    const wrap = document.querySelector('.map-wrap');
    const bins = Math.max(16, Math.min(256, Math.floor(wrap.clientWidth / 5)));
    mapBusy = true;
    try {
      const ret = await api('/v1/sessions/' + s.id + '/retention?bins=' + bins);
      if (ret.id !== state.selected) return;
      state.map = { ret, col: state.map && state.map.ret.id === ret.id ? state.map.col : -1 };
      drawMap();
    } catch (e) {
      if (e.code !== 'session_busy') say('Retention map: ' + e.message);
      else setTimeout(() => { if (state.selected === s.id) loadMap(); }, 1000 * (e.retryAfter || 1));
    } finally {
      mapBusy = false;
      if (mapAgain) { mapAgain = false; loadMap(); }
    }
  }

  // While a document streams in, the open map follows it (at most every 1.5 s).
  function liveMap(id) {
    if (currentTab() !== 'map' || state.selected !== id) return;
    const now = performance.now();
    if (now < mapNext) return;
    mapNext = now + 1500;
    loadMap();
  }

  function drawMap() {
    const m = state.map;
    if (!m) return;
    const { ret } = m;
    const canvas = $('map'), n = ret.tokens_ingested, L = ret.layers.length, bins = ret.bins;
    $('map-empty').hidden = n > 0;
    canvas.hidden = n === 0;
    const cssW = canvas.parentElement.clientWidth;
    const cellH = Math.max(4, Math.min(10, Math.floor(300 / L)));
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = cssW + 'px';
    canvas.style.height = (cellH * L) + 'px';
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cellH * L * dpr);
    canvas.dataset.bins = bins;
    canvas.dataset.layers = L;
    const g = canvas.getContext('2d');
    g.imageSmoothingEnabled = false;
    const W = canvas.width, H = canvas.height;
    m.values = [];
    for (let l = 0; l < L; l++) {
      const row = ret.layers[l].kept_per_bin;
      m.values.push([]);
      for (let b = 0; b < bins; b++) {
        const size = binStart(b + 1, bins, n) - binStart(b, bins, n);
        const v = size > 0 ? row[b] / size : 0;
        m.values[l].push(v);
        g.fillStyle = 'rgb(' + colorFor(v).join(',') + ')';
        const x0 = Math.round(b * W / bins), x1 = Math.round((b + 1) * W / bins);
        const y0 = Math.round(l * H / L), y1 = Math.round((l + 1) * H / L);
        g.fillRect(x0, y0, x1 - x0, y1 - y0);
      }
    }
    if (m.col >= 0) {
      g.strokeStyle = '#1f6feb';
      g.lineWidth = Math.max(2, dpr * 2);
      const x0 = Math.round(m.col * W / bins), x1 = Math.round((m.col + 1) * W / bins);
      g.strokeRect(x0 + 1, 1, Math.max(2, x1 - x0 - 2), H - 2);
    }
    const s = state.sessions.find((x) => x.id === ret.id);
    const pot = s ? s.tokens_in_pot : 0;
    // share of the pot's document entries in the last tenth of the document
    let recent = 0, all = 0;
    for (const layer of ret.layers) layer.kept_per_bin.forEach((k, b) => { all += k; if (b >= bins * 0.9) recent += k; });
    fillStats($('map-stats'), [
      ['Document', nf.format(n) + ' tokens', 'map-tokens'],
      ['Coverage', (ret.coverage * 100).toFixed(2) + ' %', 'map-coverage'],
      ['Pot', s ? nf.format(pot) + ' of ' + nf.format(s.budget_tokens) : '–'],
      ['Last tenth of the text', all ? (recent / all * 100).toFixed(0) + ' % of the pot' : '–'],
    ]);
    canvas.setAttribute('aria-label', 'Retention map: ' + L + ' layers by ' + bins + ' stretches of the document; ' +
      (ret.coverage * 100).toFixed(1) + ' percent of the document is kept on average.');
  }

  function columnAt(ev) {
    const m = state.map;
    if (!m) return -1;
    const r = $('map').getBoundingClientRect();
    return Math.max(0, Math.min(m.ret.bins - 1, Math.floor((ev.clientX - r.left) / r.width * m.ret.bins)));
  }

  let regionTimer = 0, regionSeq = 0;
  function pickColumn(col, now) {
    const m = state.map;
    if (!m || col < 0 || col === m.col && !now) return;
    m.col = col;
    drawMap();
    clearTimeout(regionTimer);
    regionTimer = setTimeout(() => loadRegion(col), now ? 0 : 200);
  }

  async function loadRegion(col) {
    const m = state.map;
    const { ret } = m, n = ret.tokens_ingested;
    const start = binStart(col, ret.bins, n), end = Math.min(binStart(col + 1, ret.bins, n), start + 8192);
    const my = ++regionSeq;
    $('region').hidden = false;
    $('region-title').textContent = 'Tokens ' + nf.format(start) + '–' + nf.format(end) + ' of ' + nf.format(n);
    const mean = m.values ? m.values.reduce((a, row) => a + row[col], 0) / m.values.length : 0;
    $('region-share').textContent = (mean * 100).toFixed(1) + ' % kept (mean over layers)';
    try {
      const t = await api('/v1/sessions/' + ret.id + '/text?start=' + start + '&end=' + end);
      if (my !== regionSeq) return;
      const box = $('region-text');
      box.replaceChildren(...t.spans.map((sp) => {
        const span = el('span', { text: sp.text });
        const a = sp.kept / t.heads;
        // the warm, light end of the map's colours, so that the text stays readable
        if (a > 0) span.style.backgroundColor = 'rgba(' + colorFor(0.02 + 0.2 * a).join(',') + ',' + (0.25 + 0.6 * a).toFixed(2) + ')';
        span.title = sp.kept + ' of ' + t.heads + ' layer·heads hold this';
        return span;
      }));
      if (!t.spans.length) box.textContent = t.end <= t.start ? '(the text of this stretch is still being stored)' : '';
      box.scrollTop = 0;
    } catch (e) {
      say('Document text: ' + e.message);
    }
  }

  $('map').addEventListener('mousemove', (ev) => pickColumn(columnAt(ev)));
  $('map').addEventListener('click', (ev) => pickColumn(columnAt(ev), true));
  $('map').addEventListener('keydown', (ev) => {
    const m = state.map;
    if (!m) return;
    const d = { ArrowRight: 1, ArrowLeft: -1, End: 1e9, Home: -1e9 }[ev.key];
    if (d === undefined) return;
    ev.preventDefault();
    pickColumn(Math.max(0, Math.min(m.ret.bins - 1, (m.col < 0 ? 0 : m.col) + d)));
  });
  $('map-refresh').addEventListener('click', () => { loadSessions().then(loadMap).catch((e) => say(e.message)); });
  let resizeTimer = 0;
  window.addEventListener('resize', () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => { if (currentTab() === 'map') loadMap(); }, 300); });

  // ---- keys ----------------------------------------------------------------------------------------------

  $('key-form').addEventListener('submit', (ev) => {
    const v = $('key-input').value.trim();
    if (!v) { ev.preventDefault(); return; }
    if (!/^[\x21-\x7e]+$/.test(v)) { // (a header cannot carry it: every request would fail before it left)
      ev.preventDefault();
      $('key-error').textContent = 'An API key is printable ASCII without spaces: check for a pasted dash or quote.';
      $('key-error').hidden = false;
      return;
    }
    sessionStorage.setItem(KEY_STORE, v);
    $('key-input').value = '';
    const w = keyWaiters;
    keyWaiters = [];
    w.forEach((f) => f());
  });
  $('key-forget').addEventListener('click', () => { sessionStorage.removeItem(KEY_STORE); $('key-input').value = ''; });
  $('key-dialog').addEventListener('cancel', (ev) => { if (keyWaiters.length) ev.preventDefault(); });
  $('key-button').addEventListener('click', () => { $('key-error').hidden = true; $('key-dialog').showModal(); });

  // ---- start ---------------------------------------------------------------------------------------------

  // What the page does once it reaches the server; tried again at each poll until it has succeeded
  // (a page opened while the server was down or draining).
  let connected = false, connecting = false, unreachable = null;
  async function connect() {
    if (connecting) return;
    connecting = true;
    try {
      await serverInfo();
      if (sessionStorage.getItem(KEY_STORE)) $('key-button').hidden = false;
      await loadSessions();
      if (!state.selected && state.sessions.length) select(state.sessions[0].id);
      await resumeUpload();
      connected = true;
      if (unreachable) unreachable.remove();
    } finally {
      connecting = false;
    }
  }

  drawLegend();
  connect().catch((e) => { // (a fetch with no answer says so itself)
    unreachable = say(e instanceof ApiError ? 'Cannot reach the server: ' + e.message : e.message, 'error', true);
  });
  // A page that had reached the server says when the server stops answering its polls, until one
  // is answered again (an upload says so in its own note).
  let lost = null;
  setInterval(() => {
    if (document.hidden || uploading()) return;
    (connected ? loadSessions() : connect()).then(() => {
      if (lost) lost.remove();
      lost = null;
    }).catch((e) => {
      if (connected && !lost && !(e instanceof ApiError)) lost = say(e.message + '. Trying again every 10 s.', 'error', true);
    });
  }, 10000);
})();
