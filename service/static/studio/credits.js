// The balance, the lots it is made of, and the ledger, a page at a time.
import { $, h } from './dom.js';
import { t, formatDate, formatNumber, onLang } from './i18n.js';
import { get, describe, knowOwed } from './api.js';
import { setBalance } from './state.js';

const status = $('#credits-status');
const body = $('#credits-body');
const more = $('#entries-more');
let data = null;
let cursor = null;
let round = 0;

export async function showCredits() {
  round += 1;
  const mine = round;
  status.textContent = t('loading');
  try {
    const page = await get('/credits?limit=20');
    if (mine !== round) return;
    data = { ...page, entries: [...page.entries] };
    cursor = page.next_cursor;
    setBalance(page.balance);
    knowOwed(page.credits_owed);
    status.textContent = '';
    render();
  } catch (error) {
    if (mine === round) status.textContent = describe(error);
  }
}

export function hideCredits() {
  round += 1;
  body.hidden = true;
  data = null;
}

async function loadMore() {
  more.disabled = true;
  try {
    const page = await get(`/credits?limit=20&cursor=${encodeURIComponent(cursor)}`);
    data.entries.push(...page.entries);
    cursor = page.next_cursor;
    render();
  } catch (error) {
    status.textContent = describe(error);
  } finally {
    more.disabled = false;
  }
}

function render() {
  if (!data) return;
  body.hidden = false;
  $('#credits-balance').textContent = formatNumber(data.balance);
  const owed = $('#credits-owed');
  owed.hidden = !data.credits_owed;
  owed.textContent = data.credits_owed ? t('owed', { n: formatNumber(data.credits_owed) }) : '';
  $('#lots').replaceChildren(...(data.lots.length ? data.lots.map((lot) => h('tr', {},
    h('td', { text: t(`lot_${lot.kind}`) }),
    h('td', { class: 'num', text: formatNumber(lot.remaining) }),
    h('td', { class: 'num', text: formatNumber(lot.granted) }),
    h('td', { text: formatDate(lot.expires_at, false) }))) : [emptyRow(4)]));
  // Explicit roles: on a phone the rows are laid out as cards, still read as a table.
  $('#entries').replaceChildren(...(data.entries.length ? data.entries.map((entry) => h('tr', { role: 'row' },
    h('td', { role: 'cell', class: 'when', text: formatDate(entry.created_at) }),
    h('td', { role: 'cell', class: 'kind', text: t(`entry_${entry.kind}`) }),
    h('td', { role: 'cell', class: `num amount${entry.amount > 0 ? ' plus' : ''}`, text: (entry.amount > 0 ? '+' : '') + formatNumber(entry.amount) }),
    h('td', { role: 'cell', class: 'num after', 'data-label': t('balance_after'), text: formatNumber(entry.balance_after) }),
    h('td', { role: 'cell', class: 'note', text: entry.note || '' }))) : [emptyRow(5)]));
  more.hidden = !cursor;
}

function emptyRow(span) {
  return h('tr', { role: 'row' }, h('td', { role: 'cell', colspan: span, text: t('no_entries') }));
}

more.addEventListener('click', loadMore);
onLang(render);
