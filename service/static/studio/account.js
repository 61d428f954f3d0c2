// My account: who I am, sign out everywhere, export my data, delete my account.
import { $, h, toast } from './dom.js';
import { t, formatDate, formatNumber, onLang } from './i18n.js';
import { api, get, post, describe, knowOwed } from './api.js';
import { state, on, emit, setUser, setBalance, signOut } from './state.js';
import { sendCode, codeField, openSignIn } from './auth.js';

// This browser's last export ({account, id}), so a reload still finds its link,
// and the deletion it made ({purge_at}), so the signed-out page can say when.
const EXPORT = 'studio.export';
const GONE = 'studio.deleted';
// The refund policy's arithmetic, as service/payments/refunds.py does it.
const DAY_MS = 86_400_000;
const FULL_DAYS = 7;
const LAST_DAY = 180;
const FEN_PER_CREDIT = 10;
const FEE_PERCENT = 5;
const ORDER_PAGES = 5;

const status = $('#account-status');
const body = $('#account-body');
const gone = $('#account-gone');
const exportButton = $('#a-export');
const exportState = $('#a-export-state');
const exportReady = $('#a-export-ready');
const exportError = $('#a-export-error');
const start = $('#a-delete-start');
const form = $('#a-delete-form');
const confirmButton = $('#a-delete-confirm');
const codeInput = $('#a-code');
const resend = $('#a-resend');
const deleteError = $('#a-delete-error');
const typedCode = codeField(codeInput);

let data = null; // { me, credits, orders }
let shown = null; // the export this view shows
const heard = new Map(); // exports the stream told about, by id (it may beat the POST's answer)
let asking = false;
let round = 0;
let resendAt = 0;
let timer = 0;
let expiryTimer = 0;

function stored(key) {
  try { return JSON.parse(localStorage.getItem(key) || 'null'); } catch { return null; }
}

function store(key, value) {
  try {
    if (value === null) localStorage.removeItem(key);
    else localStorage.setItem(key, JSON.stringify(value));
  } catch { /* storage off: this page still knows until it is closed */ }
}

const instant = (value) => (typeof value === 'number' ? new Date(value * 1000).toISOString() : value);

/** The deletion this browser made, while its purge is still ahead. */
function deletion() {
  const info = stored(GONE);
  if (info && Date.parse(instant(info.purge_at)) > Date.now()) return info;
  if (info) store(GONE, null);
  return null;
}

/** Tell whether the account view has something to show without a session. */
export const accountGone = () => !state.user && Boolean(deletion());

export async function showAccount() {
  round += 1;
  const mine = round;
  if (!state.user) {
    renderGone();
    return;
  }
  gone.hidden = true;
  status.textContent = t('loading');
  try {
    const [me, credits, orders] = await Promise.all([get('/me'), get('/credits?limit=1'), recentOrders()]);
    if (mine !== round) return;
    setBalance(credits.balance);
    knowOwed(credits.credits_owed);
    data = { me, credits, orders };
    status.textContent = '';
    body.hidden = false;
    render();
    await loadExport(mine);
  } catch (error) {
    if (mine === round) status.textContent = describe(error);
  }
}

export function hideAccount() {
  round += 1;
  body.hidden = true;
  gone.hidden = true;
  closeDeleteForm();
}

/** My orders young enough to be refundable (newest first, a few pages at most). */
async function recentOrders() {
  const found = [];
  let cursor = null;
  for (let page = 0; page < ORDER_PAGES; page += 1) {
    const answer = await get(`/orders?limit=50${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    found.push(...answer.items);
    cursor = answer.next_cursor;
    const last = answer.items[answer.items.length - 1];
    if (!cursor || !last || Date.now() - Date.parse(last.created_at) > (LAST_DAY + 1) * DAY_MS) break;
  }
  return found;
}

/** Paid orders with purchased credits left to refund: what deleting would forfeit. */
function refundable() {
  const lots = new Map(data.credits.lots.filter((l) => l.kind === 'purchase' && l.order_id).map((l) => [l.order_id, l]));
  const now = Date.now();
  return data.orders.flatMap((order) => {
    const lot = lots.get(order.id);
    if (order.status !== 'paid' || !order.paid_at || !lot) return [];
    const day = Math.floor((now - Date.parse(order.paid_at)) / DAY_MS) + 1;
    const credits = Math.max(0, Number(order.credits) - (Number(lot.granted) - Number(lot.remaining)));
    if (day > LAST_DAY || credits === 0) return [];
    const fen = credits * FEN_PER_CREDIT;
    const fee = day <= FULL_DAYS ? 0 : Math.floor((fen * FEE_PERCENT + 50) / 100);
    return [{ order, credits, fen: fen - fee, fee }];
  });
}

const pack = (o) => (Number(o.bonus)
  ? t('pack_total_bonus', { n: formatNumber(Number(o.credits)), bonus: formatNumber(Number(o.bonus)) })
  : t('pack_total', { n: formatNumber(Number(o.credits)) }));

function render() {
  if (!data) return;
  const { me, credits } = data;
  $('#a-email').textContent = me.email;
  const owed = Number(credits.credits_owed ?? me.credits_owed) || 0;
  $('#a-owed').textContent = owed ? formatNumber(owed) : t('owed_none');
  $('#a-created').textContent = formatDate(me.created_at, false);
  renderBalance();
  renderExport();
  if (!form.hidden) $('#a-delete-sent').textContent = t('delete_sent', { email: me.email });
}

function renderBalance() {
  if (!data) return;
  const balance = state.balance ?? data.credits.balance;
  $('#a-balance').textContent = formatNumber(balance);
  const rows = refundable();
  $('#a-refundable').hidden = rows.length === 0;
  $('#a-refund-list').replaceChildren(...rows.map((r) => h('li', {
    dataset: { id: r.order.id },
    text: t('refund_row', {
      date: formatDate(r.order.paid_at, false),
      pack: pack(r.order),
      id: r.order.id,
      n: formatNumber(r.credits),
      yuan: t('yuan', { n: (r.fen / 100).toFixed(2) }),
    }) + (r.fee ? t('refund_fee') : ''),
  })));
  const purchased = data.credits.lots.filter((l) => l.kind === 'purchase').reduce((sum, l) => sum + Number(l.remaining), 0);
  $('#a-forfeit').textContent = purchased
    ? t('forfeit', { n: formatNumber(balance), p: formatNumber(Math.min(purchased, balance)) })
    : t('forfeit_plain', { n: formatNumber(balance) });
  $('#a-purge-when').textContent = t('purge_when', { days: Number(document.body.dataset.grace) || 7 });
}

// Export my data: ask, watch the stream (or ask once after a reload), download.

const myExport = () => {
  const saved = stored(EXPORT);
  return saved && saved.account === state.user?.id ? saved.id : null;
};

async function loadExport(mine) {
  const id = myExport();
  if (!id) return;
  try {
    const answer = await get(`/account/exports/${encodeURIComponent(id)}`);
    if (mine !== round) return;
    shown = answer;
  } catch (error) {
    if (error.status !== 404) return;
    store(EXPORT, null); // gone: nothing to show
    shown = null;
  }
  renderExport();
}

function renderExport() {
  clearTimeout(expiryTimer);
  exportButton.disabled = asking || shown?.status === 'pending';
  if (asking) return;
  const ready = shown?.status === 'ready' && shown.download_url;
  const expires = ready && shown.expires_at ? Date.parse(shown.expires_at) : Infinity;
  const live = ready && expires > Date.now();
  exportReady.hidden = !live;
  if (!shown) {
    exportState.textContent = '';
  } else if (shown.status === 'pending') {
    exportState.textContent = t('export_pending');
  } else if (live) {
    exportState.textContent = t('export_ready', { date: formatDate(shown.created_at) });
    $('#a-export-link').href = shown.download_url;
    $('#a-export-expiry').textContent = Number.isFinite(expires) ? t('export_expiry', { date: formatDate(shown.expires_at) }) : '';
    // The link stops working at its expiry: say so then, without a reload.
    if (Number.isFinite(expires)) expiryTimer = setTimeout(renderExport, Math.min(expires - Date.now() + 500, 2 ** 31 - 1));
  } else if (ready) {
    exportState.textContent = t('export_expired');
  } else {
    exportState.textContent = t('export_failed');
  }
}

exportButton.addEventListener('click', async () => {
  exportError.textContent = '';
  asking = true;
  exportState.textContent = t('export_asking');
  renderExport();
  try {
    const answer = await api('POST', '/account/export');
    store(EXPORT, { account: state.user.id, id: answer.id });
    shown = heard.get(answer.id) || answer;
  } catch (error) {
    exportError.textContent = error.code === 'RATE_LIMITED'
      ? t('export_limited', { date: formatDate(new Date(Date.now() + (Number(error.body.retry_after) || 0) * 1000).toISOString()) })
      : describe(error);
  } finally {
    asking = false;
    renderExport();
  }
});

on('export', (x) => {
  heard.set(x.id, x);
  if (x.id !== myExport()) return;
  shown = x;
  if (!body.hidden) renderExport();
});

// Sign out here (on a phone the header leaves it to this view), or everywhere.

$('#a-logout').addEventListener('click', async () => {
  try {
    await signOut();
    toast(t('signed_out'));
  } catch (error) {
    $('#a-sessions-error').textContent = describe(error);
  }
});

$('#a-logout-all').addEventListener('click', async (event) => {
  const button = event.currentTarget;
  $('#a-sessions-error').textContent = '';
  button.disabled = true;
  emit('signing-out');
  try {
    await api('POST', '/auth/logout-everywhere');
    setUser(null);
    toast(t('signed_out_everywhere'));
  } catch (error) {
    $('#a-sessions-error').textContent = describe(error);
    emit('signing-out-failed');
  } finally {
    button.disabled = false;
  }
});

// Delete my account: a code mailed to my own address, then the signed-out page.

function tick() {
  clearTimeout(timer);
  const left = Math.ceil((resendAt - Date.now()) / 1000);
  resend.disabled = left > 0;
  resend.textContent = left > 0 ? t('resend_in', { s: left }) : t('resend');
  if (left > 0) timer = setTimeout(tick, 1000);
}

async function askForCode() {
  deleteError.textContent = '';
  const answer = await sendCode(state.user.email, (text) => { deleteError.textContent = text; });
  resendAt = Date.now() + (answer.resend_after ?? 60) * 1000;
  tick();
}

function closeDeleteForm() {
  clearTimeout(timer);
  form.hidden = true;
  start.hidden = false;
  deleteError.textContent = '';
  codeInput.value = '';
}

start.addEventListener('click', async () => {
  start.disabled = true;
  try {
    await askForCode();
    form.hidden = false;
    start.hidden = true;
    $('#a-delete-sent').textContent = t('delete_sent', { email: state.user.email });
    codeInput.focus();
  } catch (error) {
    deleteError.textContent = describe(error);
  } finally {
    start.disabled = false;
  }
});

resend.addEventListener('click', async () => {
  resend.disabled = true;
  try {
    await askForCode();
    codeInput.focus();
  } catch (error) {
    deleteError.textContent = describe(error);
    tick();
  }
});

$('#a-delete-cancel').addEventListener('click', () => {
  closeDeleteForm();
  start.focus();
});

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const code = typedCode();
  if (code.length !== 8) {
    deleteError.textContent = t('err_INVALID_CODE');
    codeInput.focus();
    return;
  }
  deleteError.textContent = '';
  confirmButton.disabled = true;
  confirmButton.textContent = t('deleting');
  // Every session ends with the answer: the stream closes first, not with a 401.
  emit('signing-out');
  try {
    const answer = await post('/account/delete', { code });
    store(GONE, { purge_at: answer.purge_at });
    store(EXPORT, null);
    closeDeleteForm();
    setUser(null);
    const heading = $('#h-gone');
    heading.tabIndex = -1;
    heading.focus();
  } catch (error) {
    emit('signing-out-failed');
    deleteError.textContent = describe(error);
    codeInput.select();
  } finally {
    confirmButton.disabled = false;
    confirmButton.textContent = t('delete_confirm');
  }
});

$('#a-restore').addEventListener('click', () => openSignIn(false));

function renderGone() {
  const info = deletion();
  body.hidden = true;
  gone.hidden = !info;
  if (!info) return;
  status.textContent = '';
  $('#account-gone-text').textContent = t('gone_text', { date: formatDate(instant(info.purge_at)) });
}

on('user', (user) => {
  // Signing in (again) is what restores a deleted account: nothing is pending then.
  if (user) store(GONE, null);
  data = null;
  shown = null;
  heard.clear();
  closeDeleteForm();
});
on('balance', () => { if (!body.hidden) renderBalance(); });
onLang(() => {
  if (!body.hidden) render();
  if (!gone.hidden) renderGone();
  if (!form.hidden) tick();
});
