// Buying credits: the packs, a channel, the order's QR code or redirect, the wait, and my orders.
import { $, h, toast, randomKey } from './dom.js';
import { t, formatDate, formatNumber, onLang } from './i18n.js';
import { get, post, describe, knowOwed } from './api.js';
import { on, setBalance } from './state.js';

const status = $('#buy-status');
const body = $('#buy-body');
const form = $('#buy-form');
const submit = $('#buy-submit');
const errorBox = $('#buy-error');
const panel = $('#buy-order');
const qr = $('#buy-qr');
const qrImg = $('#buy-qr-img');
const more = $('#orders-more');
// An order only moves forward; a late payment turns an expired order into a paid one.
const RANK = { created: 0, expired: 1, paid: 2, refunded: 3 };
const PHONE = /Android|iPhone|iPad|iPod|Mobile|HarmonyOS/i;
const EXPIRY_SLACK_MS = 2000;

let catalog = null; // GET /api/packs: what is sold and how it can be paid
let owed = 0;
let orders = []; // my orders, newest first
let cursor = null;
let watched = null; // { id, order, action }: the order this page waits for
let expiryTimer = 0;
let round = 0;
const choice = { pack: null, channel: null };
// The return page: /studio?order=<id>#buy, where the provider sends the browser back.
let returning = new URLSearchParams(location.search).get('order');

/** Which checkout the provider should offer: a phone's (H5, wap) or a desktop's (QR, page). */
export function device() {
  return innerWidth < 700 || PHONE.test(navigator.userAgent) ? 'mobile' : 'desktop';
}

export async function showBuy() {
  round += 1;
  const mine = round;
  status.textContent = t('loading');
  try {
    const [packs, credits, page] = await Promise.all([
      catalog || get('/packs'),
      get('/credits?limit=1'),
      get('/orders?limit=10'),
    ]);
    if (mine !== round) return;
    catalog = packs;
    learnOwed(credits.credits_owed);
    setBalance(credits.balance);
    orders = [];
    for (const order of page.items) remember(order);
    cursor = page.next_cursor;
    status.textContent = '';
    body.hidden = false;
    render();
    if (returning) {
      const id = returning;
      returning = null;
      // Not a navigation: the address loses the order so a reload later does not wait again.
      history.replaceState(history.state, '', `${location.pathname}#buy`);
      watch({ id, status: 'created' }, null, false);
      check(id);
    }
  } catch (error) {
    if (mine === round) status.textContent = describe(error);
  }
}

export function hideBuy() {
  round += 1;
  body.hidden = true;
}

function learnOwed(n) {
  owed = Number(n) || 0;
  knowOwed(owed);
}

const yuan = (n) => t('yuan', { n: formatNumber(n) });
const total = (o) => (Number(o.bonus)
  ? t('pack_total_bonus', { n: formatNumber(Number(o.credits)), bonus: formatNumber(Number(o.bonus)) })
  : t('pack_total', { n: formatNumber(Number(o.credits)) }));
const credited = (o) => Number(o.credits) + Number(o.bonus);
const chosenPack = () => catalog?.packs.find((p) => p.id === choice.pack);

/** Keep an order's newest state in the history; answer whether this one is news. */
function remember(order) {
  const at = orders.findIndex((o) => o.id === order.id);
  if (at < 0) {
    orders.push(order);
    orders.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
    return true;
  }
  const old = orders[at];
  if (RANK[order.status] < RANK[old.status]) return false;
  orders[at] = order;
  return true;
}

function render() {
  if (!catalog) return;
  renderHold();
  renderForm();
  renderPanel();
  renderOrders();
}

function renderHold() {
  $('#buy-hold').hidden = !owed;
  $('#buy-hold-text').textContent = owed ? t('owed', { n: formatNumber(owed) }) : '';
}

function renderForm() {
  const { packs } = catalog;
  if (!chosenPack()) choice.pack = packs[0]?.id ?? null;
  $('#buy-packs').replaceChildren(...packs.map((p) => h('label', { class: 'pack' },
    h('input', {
      type: 'radio', name: 'pack', value: p.id, checked: p.id === choice.pack,
      on: { change: () => { choice.pack = p.id; renderSubmit(); } },
    }),
    h('span', { class: 'pack-card' },
      h('span', { class: 'pack-price', text: yuan(p.yuan) }),
      h('span', { class: 'pack-credits', text: t('pack_credits', { n: formatNumber(p.credits) }) }),
      h('span', { class: p.bonus ? 'pack-bonus' : 'pack-bonus none', text: p.bonus ? t('pack_bonus', { n: formatNumber(p.bonus) }) : t('pack_no_bonus') })))));
  const channels = catalog.channels.filter((c) => c.available);
  if (!channels.some((c) => c.id === choice.channel)) choice.channel = channels[0]?.id ?? null;
  $('#buy-channels').replaceChildren(...channels.map((c) => h('label', { class: 'channel' },
    h('input', {
      type: 'radio', name: 'channel', value: c.id, checked: c.id === choice.channel,
      on: { change: () => { choice.channel = c.id; renderSubmit(); } },
    }),
    h('span', { class: `channel-name ${c.id}`, text: t(`channel_${c.id}`) }))));
  $('#buy-no-channel').hidden = channels.length > 0;
  renderSubmit();
}

function renderSubmit() {
  const pack = chosenPack();
  submit.textContent = pack ? t('pay_amount', { yuan: yuan(pack.yuan) }) : t('pay');
  submit.disabled = !pack || !choice.channel;
}

function renderPanel() {
  const order = watched?.order;
  const waiting = Boolean(watched) && order.status === 'created';
  panel.hidden = !watched;
  form.hidden = waiting;
  $('#buy-other').hidden = !waiting;
  if (!watched) return;
  panel.dataset.status = order.status;
  $('#buy-order-what').textContent = order.yuan === undefined ? ''
    : t('order_what', { credits: total(order), yuan: yuan(order.yuan), channel: t(`channel_${order.channel}`) });
  const showQr = waiting && watched.action?.type === 'qrcode';
  qr.hidden = !showQr;
  if (showQr) {
    const src = `/api/orders/${encodeURIComponent(order.id)}/qrcode`;
    if (qrImg.getAttribute('src') !== src) qrImg.src = src;
    qrImg.alt = t('qr_alt', { yuan: yuan(order.yuan) });
  }
  const words = {
    created: watched.checked ? 'state_waiting' : 'state_checking',
    paid: 'state_paid', expired: 'state_expired', refunded: 'state_refunded',
  };
  $('#buy-order-state').textContent = t(words[order.status] || 'state_checking', { n: formatNumber(credited(order)) });
}

function renderOrders() {
  $('#orders').replaceChildren(...(orders.length ? orders.map((o) => h('tr', { dataset: { id: o.id, status: o.status } },
    h('td', { text: formatDate(o.created_at) }),
    h('td', { text: total(o) }),
    h('td', { class: 'num', text: yuan(o.yuan) }),
    h('td', { text: t(`channel_${o.channel}`) }),
    h('td', { class: 'ostatus', text: t(`ostatus_${o.status}`) }),
    h('td', { class: 'num', text: Number(o.refunded_yuan) > 0 ? t('yuan', { n: o.refunded_yuan }) : '—' }))) : [h('tr', {}, h('td', { colspan: 6, text: t('no_orders') }))]));
  more.hidden = !cursor;
}

/** Wait for one order here: shown in the panel, moved on by the event stream. */
function watch(order, action, checked = true) {
  clearTimeout(expiryTimer);
  watched = { id: order.id, order, action, checked };
  if (order.expires_at && order.status === 'created') {
    // Nobody announces an expiry the moment it happens: ask once it is due.
    const due = Date.parse(order.expires_at) - Date.now() + EXPIRY_SLACK_MS;
    expiryTimer = setTimeout(() => check(order.id), Math.min(Math.max(due, 0), 2 ** 31 - 1));
  }
  renderPanel();
}

/** Ask for an order once (the server then asks its provider, if it is still unpaid). */
async function check(id) {
  try {
    arrived(await get(`/orders/${encodeURIComponent(id)}`));
  } catch (error) {
    if (watched?.id === id) $('#buy-order-state').textContent = describe(error);
  }
}

/** An order's new state, from an answer or from the stream. */
function arrived(order) {
  const known = orders.find((o) => o.id === order.id);
  const refunded = known && order.refunded_yuan !== known.refunded_yuan;
  if (!remember(order) && watched?.id !== order.id) return;
  // A refund at the provider may take back more than is left: the hold may begin.
  if (refunded) refreshCredits();
  if (watched?.id === order.id) {
    const before = watched.order;
    if (before.yuan === undefined || RANK[order.status] >= RANK[before.status]) {
      watched.order = order;
      watched.checked = true;
      if (order.status !== 'created') clearTimeout(expiryTimer);
      if (order.status === 'paid' && before.status !== 'paid') paid(order);
    }
  }
  if (!body.hidden) {
    renderPanel();
    renderOrders();
  }
}

function paid(order) {
  toast(t('toast_paid', { n: formatNumber(credited(order)) }));
  // A purchase settles what is owed first: the hold may be over.
  refreshCredits();
}

async function refreshCredits() {
  try {
    const credits = await get('/credits?limit=1');
    learnOwed(credits.credits_owed);
    setBalance(credits.balance);
    if (!body.hidden) renderHold();
  } catch { /* the stream keeps the balance; the hold shows again next time */ }
}

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const pack = chosenPack();
  if (!pack || !choice.channel || submit.disabled) return;
  errorBox.textContent = '';
  submit.disabled = true;
  submit.textContent = t('paying');
  let leaving = false;
  try {
    // One key per press: a retried request (a lost answer) makes no second order.
    const order = await post('/orders', { pack: pack.id, channel: choice.channel, device: device() },
      { 'Idempotency-Key': randomKey() });
    const { action, ...view } = order;
    remember(view);
    renderOrders();
    if (action.type === 'redirect') {
      leaving = true;
      submit.textContent = t('redirecting', { channel: t(`channel_${choice.channel}`) });
      location.assign(action.url);
      return;
    }
    watch(view, action);
    const heading = $('#h-order');
    heading.tabIndex = -1;
    heading.focus();
  } catch (error) {
    errorBox.textContent = describe(error);
  } finally {
    if (!leaving) renderSubmit();
  }
});

$('#buy-other').addEventListener('click', () => {
  clearTimeout(expiryTimer);
  watched = null;
  renderPanel();
  form.querySelector('input[name=pack]:checked, input[name=pack]')?.focus();
});

more.addEventListener('click', async () => {
  more.disabled = true;
  try {
    const page = await get(`/orders?limit=10&cursor=${encodeURIComponent(cursor)}`);
    for (const order of page.items) remember(order);
    cursor = page.next_cursor;
    renderOrders();
  } catch (error) {
    status.textContent = describe(error);
  } finally {
    more.disabled = false;
  }
});

on('order', arrived);
on('events-open', () => {
  // Back on the stream after a gap: what it missed is asked for once.
  if (watched?.order.status === 'created') check(watched.id);
});
on('user', (user) => {
  clearTimeout(expiryTimer);
  watched = null;
  orders = [];
  cursor = null;
  learnOwed(user?.credits_owed);
  body.hidden = true;
});
onLang(render);
