// Sign in by e-mail code, in a dialog; an action that needed an account runs after.
import { $, toast } from './dom.js';
import { t, currentLang, onLang } from './i18n.js';
import { api, describe } from './api.js';
import { solveChallenge } from './proof.js';
import { state, setUser } from './state.js';

const dialog = $('#signin');
const emailForm = $('#s-email-form');
const codeForm = $('#s-code-form');
const welcome = $('#s-welcome');
const errorBox = $('#s-error');
const resend = $('#s-resend');
let pending = null;
let address = '';
let resendAt = 0;
let timer = 0;
let runAfterClose = false;

/** Run an action now if signed in; otherwise sign in first, then run it. */
export function requireSession(action) {
  if (state.user) return action();
  pending = action;
  openSignIn(true);
  return undefined;
}

export function openSignIn(needed = false) {
  show('email');
  $('#s-reason').hidden = !needed;
  $('#s-why').textContent = t('signin_why', { n: document.body.dataset.trial });
  if (!dialog.open) dialog.showModal();
  $('#s-email').focus();
}

function show(step) {
  emailForm.hidden = step !== 'email';
  codeForm.hidden = step !== 'code';
  welcome.hidden = step !== 'welcome';
  errorBox.textContent = '';
}

function busy(form, on) {
  for (const button of form.querySelectorAll('button')) button.disabled = on;
  if (!on) tick();
}

/**
 * Ask for a code mailed to an address; `say` shows a line while a challenge is solved.
 * Under load the server asks for a proof of work first: solve it, send again.
 * A new challenge after a solution (expired, or spent by a double click) is
 * solved once more; past that the error is shown.
 */
export async function sendCode(email, say) {
  const body = { email, lang: currentLang() };
  for (let round = 0; ; round += 1) {
    try {
      return await api('POST', '/auth/code', { json: body });
    } catch (error) {
      if (error.code !== 'CHALLENGE_REQUIRED' || round >= 2) throw error;
      say(t('solving'));
      try {
        body.altcha = await solveChallenge(error.body.challenge);
      } catch {
        throw error;
      } finally {
        say('');
      }
    }
  }
}

/** Accept "12345678", "1234 5678", "1234-5678" or a pasted sentence with the code in it. */
export function codeField(input) {
  input.addEventListener('input', () => {
    const digits = input.value.replace(/\D/g, '').slice(0, 8);
    const shown = digits.length > 4 ? `${digits.slice(0, 4)} ${digits.slice(4)}` : digits;
    if (shown !== input.value) input.value = shown;
  });
  return () => input.value.replace(/\D/g, '');
}

async function requestCode(email) {
  errorBox.textContent = '';
  const answer = await sendCode(email, (text) => { errorBox.textContent = text; });
  address = email;
  resendAt = Date.now() + (answer.resend_after ?? 60) * 1000;
  tick();
}

function tick() {
  clearTimeout(timer);
  const left = Math.ceil((resendAt - Date.now()) / 1000);
  if (left > 0) {
    resend.disabled = true;
    resend.textContent = t('resend_in', { s: left });
    timer = setTimeout(tick, 1000);
  } else {
    resend.disabled = false;
    resend.textContent = t('resend');
  }
}

emailForm.addEventListener('submit', async (event) => {
  event.preventDefault();
  const email = $('#s-email').value.trim();
  if (!email.includes('@')) {
    errorBox.textContent = t('err_INVALID_EMAIL');
    $('#s-email').focus();
    return;
  }
  busy(emailForm, true);
  try {
    await requestCode(email);
    show('code');
    $('#s-sent').textContent = t('code_sent', { email });
    $('#s-code').value = '';
    $('#s-code').focus();
  } catch (error) {
    errorBox.textContent = describe(error);
  } finally {
    busy(emailForm, false);
  }
});

const codeInput = $('#s-code');
const typedCode = codeField(codeInput);

codeForm.addEventListener('submit', async (event) => {
  event.preventDefault();
  const code = typedCode();
  if (code.length !== 8) {
    errorBox.textContent = t('err_INVALID_CODE');
    codeInput.focus();
    return;
  }
  busy(codeForm, true);
  try {
    const answer = await api('POST', '/auth/verify', { json: { email: address, code } });
    clearTimeout(timer);
    setUser(answer.user);
    if (answer.new_account) {
      show('welcome');
      $('#s-welcome-text').textContent = t('welcome_new', { n: answer.user.credits });
      welcome.querySelector('button').focus();
      runAfterClose = true;
    } else {
      runAfterClose = true;
      dialog.close();
      // Signing in during a deletion's grace period brings the account back.
      toast(t(answer.restored ? 'restored' : 'welcome_back'));
    }
  } catch (error) {
    errorBox.textContent = describe(error);
    if (error.code === 'CODE_EXPIRED_REQUEST_NEW') { resendAt = 0; }
    codeInput.select();
  } finally {
    busy(codeForm, false);
  }
});

resend.addEventListener('click', async () => {
  resend.disabled = true;
  try {
    await requestCode(address);
    $('#s-sent').textContent = t('code_sent', { email: address });
    codeInput.focus();
  } catch (error) {
    errorBox.textContent = describe(error);
    tick();
  }
});

$('#s-change').addEventListener('click', () => { show('email'); $('#s-email').focus(); });
for (const button of dialog.querySelectorAll('[data-close]')) button.addEventListener('click', () => dialog.close());

dialog.addEventListener('close', () => {
  clearTimeout(timer);
  const action = pending;
  pending = null;
  if (runAfterClose && action && state.user) action();
  runAfterClose = false;
});

onLang(() => {
  if (!dialog.open) return;
  $('#s-why').textContent = t('signin_why', { n: document.body.dataset.trial });
  if (address && !codeForm.hidden) $('#s-sent').textContent = t('code_sent', { email: address });
  tick();
});
