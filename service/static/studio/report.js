// The report dialog: anyone, signed in or not, reports a work in the square.
import { $, $$ } from './dom.js';
import { t } from './i18n.js';
import { post, describe } from './api.js';

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
  } catch (error) {
    errorBox.textContent = describe(error);
  } finally {
    button.disabled = false;
  }
});

for (const button of $$('[data-close]', dialog)) button.addEventListener('click', () => dialog.close());
dialog.addEventListener('close', () => { if (opener?.isConnected) opener.focus(); });
$('#r-reason').addEventListener('input', () => { errorBox.textContent = ''; });
