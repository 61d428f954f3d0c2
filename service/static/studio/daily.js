// The daily free credits: a button while today's are there, a countdown after.
import { $$, h, toast } from './dom.js';
import { t, formatNumber, onLang } from './i18n.js';
import { api, get, describe } from './api.js';
import { state, on, setBalance } from './state.js';

const STORE = 'studio.daily.';
let nextAt = 0; // when (ms) the next claim opens, as the server said
let timer = 0;

function remembered() {
  try { return Number(localStorage.getItem(STORE + state.user.id)) || 0; } catch { return 0; }
}

function remember(at) {
  nextAt = at;
  try { localStorage.setItem(STORE + state.user.id, String(at)); } catch { /* kept for this page only */ }
}

/** 5:03:09 until the next claim. */
function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const two = (n) => String(n).padStart(2, '0');
  return `${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}`;
}

function render() {
  clearTimeout(timer);
  const waiting = Boolean(state.user) && nextAt > Date.now();
  for (const slot of $$('[data-daily]')) {
    slot.hidden = !state.user;
    if (!slot.firstChild) {
      slot.append(
        h('button', { type: 'button', class: 'daily-claim', on: { click: (e) => claim(e.currentTarget) } }),
        h('p', { class: 'daily-next hint', tabindex: -1 }),
      );
    }
    const [button, line] = slot.children;
    button.textContent = t('daily_claim');
    button.hidden = waiting;
    line.hidden = !waiting;
    line.textContent = waiting ? t('daily_next', { t: clock(nextAt - Date.now()) }) : '';
  }
  if (waiting) timer = setTimeout(render, 1000 - (Date.now() % 1000) + 10);
}

async function claim(button) {
  button.disabled = true;
  try {
    const body = await api('POST', '/credits/daily');
    setBalance(body.balance);
    remember(Date.parse(body.next_at));
    toast(t('toast_daily', { n: formatNumber(body.granted) }));
  } catch (error) {
    if (error.code === 'ALREADY_CLAIMED' && error.body.next_at) remember(Date.parse(error.body.next_at));
    toast(describe(error));
  } finally {
    button.disabled = false;
  }
  const focused = document.activeElement === button;
  render();
  if (focused && button.hidden) button.nextElementSibling.focus();
}

const DAY = 24 * 3600 * 1000;
const BEIJING = 8 * 3600 * 1000;
/** The next midnight in Beijing (UTC+8) after a moment, in ms. */
const nextMidnight = (ms) => (Math.floor((ms + BEIJING) / DAY) + 1) * DAY - BEIJING;

/** Another device may have claimed today's: the ledger's newest daily grant says. */
async function learn(user) {
  try {
    const page = await get('/credits?limit=50');
    const grant = page.entries.find((e) => e.kind === 'grant' && e.note === 'daily credits');
    if (grant && state.user?.id === user.id) {
      const opens = nextMidnight(Date.parse(grant.created_at));
      if (opens > nextAt) remember(opens);
      render();
    }
  } catch { /* the button stays; a claim says if it was taken */ }
}

on('user', (user) => {
  nextAt = user ? remembered() : 0;
  render();
  if (user && nextAt <= Date.now()) learn(user);
});
onLang(render);
