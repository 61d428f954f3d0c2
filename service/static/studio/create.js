// The create form: model, prompt, options, a reference image, the price, submit.
import { $, h, toast, randomKey } from './dom.js';
import { t, formatNumber, onLang, currentLang } from './i18n.js';
import { api, get, describe } from './api.js';
import { state, on, setBalance, modelById } from './state.js';
import { requireSession, openSignIn } from './auth.js';
import { upsert } from './jobs.js';

const MAX_UPLOAD = 10 * 1024 * 1024;
const TYPES = ['image/png', 'image/jpeg', 'image/webp'];
const form = $('#create-form');
const modelSelect = $('#c-model');
const prompt = $('#c-prompt');
const size = $('#c-size');
const count = $('#c-count');
const seed = $('#c-seed');
const negative = $('#c-negative');
const submit = $('#c-submit');
const errorBox = $('#c-error');
const drop = $('#c-drop');
const fileInput = $('#c-file');
// {id, status: 'uploading'|'ready'|'failed', url (a blob: preview), kept (from a generation)}
let reference = null;
// One Idempotency-Key per request body: a retry after a lost answer reuses it.
let attempt = null;
let sending = false;
// The style presets (GET /api/presets, in the page's language) and the one chosen.
let presets = [];
let preset = null;

const model = () => modelById(modelSelect.value);
/** Whether the model takes an optional field (`/api/models` lists them). */
const takes = (m, field) => (m.fields ?? []).includes(field);

function renderModels() {
  const chosen = modelSelect.value;
  const groups = ['image', 'video'].map((kind) => h('optgroup', { label: t(`group_${kind}`) },
    state.models.filter((m) => m.kind === kind).map((m) => h('option', {
      value: m.id,
      text: t('model_option', { name: m.name, vendor: m.vendor, credits: m.credits }) + (m.available ? '' : t('model_unavailable')),
    }))));
  modelSelect.replaceChildren(...groups.filter((g) => g.children.length));
  const fallback = state.models.find((m) => m.available) || state.models[0];
  modelSelect.value = modelById(chosen) ? chosen : fallback?.id ?? '';
  modelChanged();
}

function modelChanged() {
  const m = model();
  if (!m) return;
  const chosenSize = size.value;
  size.replaceChildren(...m.sizes.map((s) => h('option', { value: s, text: s.replace('x', ' × ') })));
  if (m.sizes.includes(chosenSize)) size.value = chosenSize;
  count.max = String(m.max_count);
  if (Number(count.value) > m.max_count) count.value = String(m.max_count);
  count.disabled = m.max_count === 1;
  if (m.max_count === 1) count.value = '1';
  $('#c-model-info').textContent = t(`model_info_${m.kind}`, {
    vendor: m.vendor, credits: m.credits, max: m.max_count, seconds: m.seconds,
  }) + (m.available ? '' : ` · ${t('reason_unavailable')}`);
  const note = $('#c-video-note');
  note.hidden = m.kind !== 'video';
  note.textContent = m.kind === 'video' ? t('video_count', { s: m.seconds }) : '';
  $('#c-reference').hidden = !m.accepts_reference;
  if (!m.accepts_reference) clearReference();
  // Only the controls this model takes: submit refuses the others (400 {field}).
  $('#c-negative-field').hidden = !takes(m, 'negative_prompt');
  $('#c-seed-field').hidden = !takes(m, 'seed');
  $('#c-more').hidden = !takes(m, 'negative_prompt') && !takes(m, 'seed');
  update();
}

function chosenCount() {
  const n = Math.trunc(Number(count.value) || 1);
  return Math.min(Math.max(n, 1), model()?.max_count ?? 1);
}

/** Show the price and the balance; disable the button and say why when it cannot go. */
function update() {
  const m = model();
  const price = m ? m.credits * chosenCount() : 0;
  const parts = m ? [t('price', { cost: formatNumber(price), price: m.credits, count: chosenCount() })] : [];
  if (state.user && state.balance !== null) parts.push(t('balance_now', { n: formatNumber(state.balance) }));
  $('#c-price').textContent = parts.join(' · ');
  let reason = '';
  if (!state.user) {
    submit.textContent = t('signin_to_create');
  } else {
    submit.textContent = t('submit');
    if (m && !m.available) reason = t('reason_unavailable');
    else if (state.balance !== null && price > state.balance) reason = t('reason_short', { need: formatNumber(price), have: formatNumber(state.balance) });
    else if (reference?.status === 'uploading') reason = t('reason_uploading');
  }
  $('#c-reason').textContent = reason;
  submit.disabled = Boolean(reason) || sending;
}

function body() {
  const m = model();
  const out = { model: m.id, prompt: prompt.value.trim(), size: size.value, count: chosenCount() };
  if (takes(m, 'negative_prompt') && negative.value.trim()) out.negative_prompt = negative.value.trim();
  if (takes(m, 'seed') && seed.value.trim() !== '') out.seed = Number(seed.value);
  if (reference?.status === 'ready' && m.accepts_reference) out.reference = reference.id;
  if (preset) out.preset = preset;
  return out;
}

async function send() {
  errorBox.textContent = '';
  if (!state.user) { openSignIn(true); return; }
  if (!prompt.value.trim()) {
    errorBox.textContent = t('reason_prompt');
    prompt.focus();
    return;
  }
  if (submit.disabled) return;
  const payload = body();
  const text = JSON.stringify(payload);
  if (attempt?.text !== text) attempt = { text, key: randomKey() };
  sending = true;
  update();
  try {
    const g = await api('POST', '/generations', { json: payload, headers: { 'Idempotency-Key': attempt.key } });
    attempt = null;
    upsert(g);
    toast(t('submitted', { n: formatNumber(g.credits) }));
  } catch (error) {
    // A lost answer (network) or one still in flight may be retried with the same key.
    if (error.status !== 0 && error.code !== 'IDEMPOTENCY_KEY_IN_USE') attempt = null;
    if (error.code === 'INSUFFICIENT_CREDITS' && typeof error.body.balance === 'number') setBalance(error.body.balance);
    errorBox.textContent = describe(error);
  } finally {
    sending = false;
    update();
  }
}

form.addEventListener('submit', (event) => { event.preventDefault(); send(); });
form.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    send();
  }
});
modelSelect.addEventListener('change', modelChanged);
count.addEventListener('input', update);
for (const field of [prompt, negative, seed, size]) field.addEventListener('input', () => { errorBox.textContent = ''; });

// Reference image: choose, or drop anywhere on the form; uploaded at once.
fileInput.addEventListener('change', () => { useFile(fileInput.files[0]); fileInput.value = ''; });
form.addEventListener('dragover', (event) => {
  if (!model()?.accepts_reference || !event.dataTransfer?.types.includes('Files')) return;
  event.preventDefault();
  drop.classList.add('over');
});
form.addEventListener('dragleave', (event) => { if (!form.contains(event.relatedTarget)) drop.classList.remove('over'); });
form.addEventListener('drop', (event) => {
  drop.classList.remove('over');
  if (!model()?.accepts_reference) return;
  event.preventDefault();
  useFile(event.dataTransfer.files[0]);
});

function useFile(file) {
  if (!file) return;
  const status = $('#c-ref-status');
  if (!TYPES.includes(file.type)) { showReference(null); status.textContent = t('err_INVALID_IMAGE'); return; }
  if (file.size > MAX_UPLOAD) { showReference(null); status.textContent = t('err_TOO_LARGE'); return; }
  requireSession(() => upload(file));
}

async function upload(file) {
  clearReference();
  const mine = { id: null, status: 'uploading', url: URL.createObjectURL(file) };
  reference = mine;
  showReference(mine);
  update();
  const data = new FormData();
  data.append('file', file, 'reference');
  try {
    const answer = await api('POST', '/uploads', { form: data });
    if (reference !== mine) return;
    Object.assign(mine, { id: answer.id, status: 'ready', width: answer.width, height: answer.height });
  } catch (error) {
    if (reference !== mine) return;
    mine.status = 'failed';
    mine.error = describe(error);
  }
  showReference(mine);
  update();
}

function showReference(ref) {
  const box = $('#c-ref-preview');
  const img = $('#c-ref-img');
  const status = $('#c-ref-status');
  box.hidden = false;
  img.hidden = !ref?.url;
  if (ref?.url) img.src = ref.url; else img.removeAttribute('src');
  $('#c-ref-remove').hidden = !ref;
  if (!ref) { status.textContent = ''; return; }
  if (ref.kept) status.textContent = t('reference_kept');
  else if (ref.status === 'uploading') status.textContent = t('uploading');
  else if (ref.status === 'ready') status.textContent = t('uploaded', { w: ref.width, h: ref.height });
  else status.textContent = ref.error;
}

function clearReference() {
  if (reference?.url) URL.revokeObjectURL(reference.url);
  reference = null;
  $('#c-ref-preview').hidden = true;
  $('#c-ref-img').removeAttribute('src');
  update();
}

$('#c-ref-remove').addEventListener('click', () => { clearReference(); fileInput.focus(); });

/** Fill the form from a work ("use this prompt") or a generation ("run again"). */
on('prefill', (fields) => {
  if (fields.model && modelById(fields.model)) {
    modelSelect.value = fields.model;
    modelChanged();
  }
  prompt.value = fields.prompt ?? prompt.value;
  if ('negative_prompt' in fields) negative.value = fields.negative_prompt || '';
  if (fields.size && model()?.sizes.includes(fields.size)) size.value = fields.size;
  if (fields.count) count.value = String(fields.count);
  if ('seed' in fields) {
    seed.value = String(fields.seed);
    form.querySelector('details').open = true;
  }
  if ('preset' in fields) choosePreset(presets.some((p) => p.id === fields.preset) ? fields.preset : null);
  if (fields.reference) {
    clearReference();
    reference = { id: fields.reference, status: 'ready', kept: true };
    showReference(reference);
  }
  errorBox.textContent = '';
  update();
  focusPrompt = true;
});

let focusPrompt = false;
/** The view was shown: put the cursor in the prompt if the form was just filled. */
export function shown() {
  if (!focusPrompt) return false;
  focusPrompt = false;
  prompt.focus();
  return true;
}

async function loadPresets() {
  try {
    presets = (await get(`/presets?lang=${currentLang()}`)).presets;
  } catch {
    presets = []; // no chips: the form works without them
  }
  renderPresets();
}

function renderPresets() {
  if (!presets.some((p) => p.id === preset)) preset = null;
  $('#c-presets').replaceChildren(...presets.map((p) => h('button', {
    type: 'button', class: 'chip', text: p.name, dataset: { preset: p.id },
    on: { click: () => choosePreset(preset === p.id ? null : p.id) },
  })));
  $('#c-presets-field').hidden = presets.length === 0;
  choosePreset(preset);
}

/** Press one chip (or none); the hint says what it adds to the prompt. */
function choosePreset(id) {
  preset = id;
  for (const chip of $('#c-presets').children) chip.setAttribute('aria-pressed', String(chip.dataset.preset === id));
  const chosen = presets.find((p) => p.id === id);
  $('#c-preset-hint').textContent = chosen ? t('preset_adds', { suffix: chosen.prompt_suffix }) : '';
}

on('models', renderModels);
loadPresets();
on('user', () => { errorBox.textContent = ''; update(); });
on('balance', update);
onLang(() => { if (state.models.length) renderModels(); if (reference) showReference(reference); loadPresets(); });
