// The report dialog: anyone, signed in or not, reports a work in the square,
// and sees how the reports sent from this browser were decided.
import { $, $$, h } from './dom.js';
import { t, formatDate, onLang } from './i18n.js';
import { get, post, describe } from './api.js';

// A report's id is its reporter's only handle (no account needed): this
// browser keeps the last few, newest first.
const KEPT = 'studio.reports';
const MAX_KEPT = 10;

const dialog = $('#report');
const form = $('#r-form');
const done = $('#r-done');
const errorBox = $('#r-error');
let work = null;
let opener = null;

/** Open the dialog for one square work; focus returns to `origin` when it closes. */
export function openReport(target, origin) {
  work = target;
  opener = origin || document.activeElement;
  form.reset();
  form.hidden = false;
  done.hidden = true;
  errorBox.textContent = '';
  dialog.showModal();
  $('input[name="category"]:checked', form).focus();
  showMine();
}

function kept() {
  try {
    const ids = JSON.parse(localStorage.getItem(KEPT) || '[]');
    return Array.isArray(ids) ? ids.filter((id) => /^[A-Za-z0-9]{20}$/.test(id)) : [];
  } catch { return []; }
}

function keep(ids) {
  try { localStorage.setItem(KEPT, JSON.stringify(ids.slice(0, MAX_KEPT))); } catch { /* this page only */ }
}

function described(report) {
  if (report.status !== 'decided') {
    return t('report_mine_received', {
      id: report.id, created: formatDate(report.created_at), due: formatDate(report.due_at),
    });
  }
  const key = report.outcome === 'removed' ? 'report_mine_removed' : 'report_mine_kept';
  return t(key, { id: report.id, decided: formatDate(report.decided_at) });
}

let shown = 0; // the latest listing: an earlier one answered late draws nothing

/** List this browser's reports with how each stands; forget those the server no longer has. */
async function showMine() {
  const turn = ++shown;
  const answers = await Promise.all(kept().map(async (id) => {
    try { return { id, report: await get(`/reports/${id}`) }; } catch (error) {
      return { id, gone: error.status === 404 };
    }
  }));
  // Forget only what the server said it lacks: a report sent meanwhile stays.
  const gone = new Set(answers.filter((answer) => answer.gone).map((answer) => answer.id));
  if (gone.size) keep(kept().filter((id) => !gone.has(id)));
  if (turn !== shown) return;
  const known = answers.filter((answer) => !answer.gone);
  $('#r-mine-list').replaceChildren(...known.map(({ id, report }) => h('li', { dataset: { report: id } },
    report ? described(report) : t('report_mine_unknown', { id }))));
  $('#r-mine').hidden = known.length === 0;
}

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const reason = $('#r-reason').value.trim();
  if (!reason) {
    errorBox.textContent = t('err_BAD_FIELD', { field: t('report_reason') });
    $('#r-reason').focus();
    return;
  }
  const category = $('input[name="category"]:checked', form)?.value || 'other';
  const button = $('button[type="submit"]', form);
  button.disabled = true;
  errorBox.textContent = '';
  try {
    const answer = await post(`/square/${encodeURIComponent(work.id)}/report`, { reason, category });
    form.hidden = true;
    done.hidden = false;
    $('#r-done-text').textContent = t('report_done', { id: answer.id });
    $('button', done).focus();
    keep([answer.id, ...kept().filter((id) => id !== answer.id)]);
    showMine();
  } catch (error) {
    errorBox.textContent = describe(error);
  } finally {
    button.disabled = false;
  }
});

for (const button of $$('[data-close]', dialog)) button.addEventListener('click', () => dialog.close());
dialog.addEventListener('close', () => { if (opener?.isConnected) opener.focus(); });
$('#r-reason').addEventListener('input', () => { errorBox.textContent = ''; });
onLang(() => { if (dialog.open) showMine(); });
