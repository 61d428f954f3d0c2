// My generations as cards that fill in live from the event stream.
import { $, h, toast, randomKey } from './dom.js';
import { t, onLang, formatNumber } from './i18n.js';
import { api, get, describe } from './api.js';
import { state, on, emit, setBalance, modelName } from './state.js';
import { List, aiBadge, tileClass, tileTags } from './feed.js';
import { openViewer } from './viewer.js';

const list = $('#jobs');
const empty = $('#jobs-empty');
const cancelAll = $('#jobs-cancel-all');
const notify = $('#jobs-notify');
const jobs = new Map();
const RANK = { queued: 0, running: 1, succeeded: 2, failed: 2, canceled: 2 };
const ACTIVE = new Set(['queued', 'running']);
const RETRYABLE = new Set(['failed', 'canceled']);
let source = null;
let retry = 0;

/** Take a generation's newest state; never step back (events may cross answers). */
export function upsert(g) {
  const known = jobs.get(g.id);
  if (known) {
    const old = known.g;
    if (RANK[g.status] < RANK[old.status]) return;
    if (g.status === old.status && g.status === 'running' && g.progress < old.progress) return;
    known.g = g;
    if (g.status === old.status && ACTIVE.has(g.status)) {
      // Progress only: update in place, so focus (on Cancel) stays where it is.
      known.el.querySelector('.job-status').textContent = statusText(g);
      const bar = known.el.querySelector('progress');
      if (bar && g.status === 'running') bar.value = g.progress;
    } else {
      const focused = known.el.contains(document.activeElement);
      known.el.replaceWith(known.el = card(g));
      if (focused) (known.el.querySelector('button') || known.el).focus();
    }
  } else {
    const el = card(g);
    jobs.set(g.id, { g, el });
    // Newest first: place by creation time among what is shown.
    const later = [...jobs.values()].filter((j) => j.el !== el && j.g.created_at <= g.created_at).map((j) => j.el);
    const after = [...list.children].find((child) => later.includes(child));
    list.insertBefore(el, after || null);
  }
  empty.hidden = jobs.size > 0;
  cancelAll.hidden = ![...jobs.values()].some((j) => j.g.status === 'queued');
}

/** Say a wait in words: "40 s", "3 min 5 s". */
function duration(seconds) {
  const s = Math.max(1, Math.round(seconds));
  return s < 60 ? t('dur_s', { s }) : t('dur_m', { m: Math.floor(s / 60), s: s % 60 });
}

/** A job's state in words: its place in line and estimate while it waits or runs. */
export function statusText(g) {
  const eta = typeof g.eta_seconds === 'number' ? g.eta_seconds : null;
  if (g.status === 'queued' && g.queue_position) {
    const place = t('status_queued_place', { n: formatNumber(g.queue_position) });
    return eta === null ? place : `${place} · ${t('eta_about', { t: duration(eta) })}`;
  }
  if (g.status === 'running') {
    const working = t('status_running', { p: Math.round(g.progress * 100) });
    return eta ? `${working} · ${t('eta_left', { t: duration(eta) })}` : working;
  }
  if (g.status === 'failed') {
    const key = `gen_${g.error}`;
    const why = t(key);
    return t('status_failed', { why: why === key ? g.error || '?' : why });
  }
  return t(`status_${g.status}`);
}

function card(g) {
  const active = ACTIVE.has(g.status);
  const works = g.status === 'succeeded' ? g.works : [];
  const bar = active ? h('progress', { max: 1, 'aria-label': t('progress_label') }) : null;
  if (bar && g.status === 'running') bar.value = g.progress;
  const view = new List(works);
  return h('li', { class: 'job', tabindex: -1, dataset: { id: g.id, status: g.status } },
    h('div', { class: 'job-head' },
      h('span', { class: 'job-model', text: modelName(g.model) }),
      h('span', { class: 'job-status', text: statusText(g) })),
    h('p', { class: 'job-prompt', text: g.prompt }),
    bar,
    g.refunded ? h('p', { class: 'refund', text: t('refunded', { n: g.credits }) }) : null,
    active ? h('button', { type: 'button', class: 'job-cancel quiet', text: t('cancel_job'), on: { click: (e) => cancel(g, e.currentTarget) } }) : null,
    RETRYABLE.has(g.status) ? h('button', { type: 'button', class: 'job-retry', text: t('try_again'), on: { click: (e) => tryAgain(g, e.currentTarget) } }) : null,
    works.length ? h('ul', { class: 'grid' }, works.map((work, i) => h('li', {},
      h('button', {
        type: 'button', class: tileClass(work),
        on: { click: (e) => openViewer(view, i, e.currentTarget) },
      }, h('img', { src: work.thumb_url, alt: work.prompt, loading: 'lazy', width: 512, height: 512 }),
      aiBadge(),
      tileTags(work))))) : null,
    h('p', { class: 'error', role: 'alert' }));
}

async function cancel(g, button) {
  button.disabled = true;
  try {
    upsert(await api('POST', `/generations/${encodeURIComponent(g.id)}/cancel`));
  } catch (error) {
    const box = jobs.get(g.id)?.el.querySelector('.error');
    if (box) box.textContent = describe(error);
    button.disabled = false;
  }
}

/** Submit a failed or canceled generation again: a new job, charged anew. */
export async function tryAgain(g, button) {
  button.disabled = true;
  try {
    const again = await api('POST', `/generations/${encodeURIComponent(g.id)}/retry`, { headers: { 'Idempotency-Key': randomKey() } });
    upsert(again);
    toast(t('toast_retried', { n: formatNumber(again.credits) }));
    const shown = jobs.get(again.id)?.el;
    if (shown && document.activeElement === button) shown.focus();
  } catch (error) {
    const box = button.parentElement?.querySelector('.error');
    if (box) box.textContent = describe(error);
  } finally {
    button.disabled = false;
  }
}

cancelAll.addEventListener('click', async () => {
  cancelAll.disabled = true;
  try {
    const { canceled } = await api('POST', '/generations/cancel', { json: { status: 'queued' } });
    toast(t('toast_canceled_all', { n: formatNumber(canceled) }));
    for (const job of jobs.values()) {
      if (job.g.status === 'queued') upsert(await get(`/generations/${encodeURIComponent(job.g.id)}`));
    }
  } catch (error) {
    toast(describe(error));
  } finally {
    cancelAll.disabled = false;
  }
});

// A browser notification when a job ends while this tab is in the background.
const canNotify = () => 'Notification' in window;
function renderNotify() { notify.hidden = !canNotify() || Notification.permission !== 'default' || !state.user; }
notify.addEventListener('click', async () => {
  try { await Notification.requestPermission(); } catch { /* refused or unsupported */ }
  renderNotify();
});
function tell(g) {
  if (!canNotify() || Notification.permission !== 'granted' || document.visibilityState !== 'hidden') return;
  const title = t(g.status === 'succeeded' ? 'notify_done' : 'notify_failed');
  try { new Notification(title, { body: g.prompt, tag: g.id, lang: document.documentElement.lang }); } catch { /* not shown */ }
}

async function loadRecent() {
  try {
    const page = await get('/generations?limit=10');
    for (const g of page.items.reverse()) upsert(g);
  } catch { /* the stream still brings the active ones */ }
}

function connect() {
  disconnect();
  const stream = new EventSource('/api/events');
  source = stream;
  stream.addEventListener('open', () => { retry = 0; emit('events-open'); });
  stream.addEventListener('credits', (e) => setBalance(JSON.parse(e.data).balance));
  stream.addEventListener('order', (e) => emit('order', JSON.parse(e.data)));
  stream.addEventListener('export', (e) => emit('export', JSON.parse(e.data)));
  stream.addEventListener('generation', (e) => {
    const g = JSON.parse(e.data);
    const before = jobs.get(g.id)?.g.status;
    upsert(g);
    if (g.status === 'succeeded' && before !== 'succeeded') emit('works-stale');
    if (before && ACTIVE.has(before) && (g.status === 'succeeded' || g.status === 'failed')) tell(g);
  });
  stream.addEventListener('error', () => {
    // The browser retries by itself unless the answer was not a stream (a 401).
    if (stream.readyState !== EventSource.CLOSED || source !== stream) return;
    source = null;
    retry = Math.min(retry + 1, 6);
    setTimeout(async () => {
      if (!state.user || source) return;
      try { await get('/me'); connect(); } catch { /* signed out: the 401 said so */ }
    }, 1000 * 2 ** retry);
  });
}

function disconnect() {
  if (source) source.close();
  source = null;
}

function clear() {
  jobs.clear();
  list.replaceChildren();
  empty.hidden = false;
  cancelAll.hidden = true;
}

on('user', (user) => {
  clear();
  renderNotify();
  if (user) { connect(); loadRecent(); } else disconnect();
});
on('signing-out', disconnect);
// A sign-out that did not happen (a wrong code on deleting): listen again.
on('signing-out-failed', () => { if (state.user && !source) connect(); });
on('models', redraw);
// A work deleted (in the viewer) leaves its job's results too.
on('work-removed', (id) => {
  for (const job of jobs.values()) {
    if (!job.g.works?.some((work) => work.id === id)) continue;
    job.g = { ...job.g, works: job.g.works.filter((work) => work.id !== id) };
    job.el.replaceWith(job.el = card(job.g));
  }
});
addEventListener('pagehide', disconnect);
onLang(redraw);

function redraw() {
  for (const job of jobs.values()) job.el.replaceWith(job.el = card(job.g));
}
