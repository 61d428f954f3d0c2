// One work at a time, large: arrows step through the list it came from, Esc closes.
import { $, h, toast, ask } from './dom.js';
import { t, formatDate, formatNumber, onLang } from './i18n.js';
import { api, get, describe } from './api.js';
import { state, emit, modelName } from './state.js';
import { requireSession } from './auth.js';
import { shelf, currentCollection, keep } from './collections.js';
import { openReport } from './report.js';
import { aiBadge } from './feed.js';

const dialog = $('#viewer');
const media = $('#v-media');
const meta = $('#v-meta');
const actions = $('#v-actions');
const errorBox = $('#v-error');
let list = null;
let index = 0;
let opener = null;
let round = 0;

export function openViewer(from, at, origin) {
  list = from;
  index = at;
  opener = origin || document.activeElement;
  if (!dialog.open) dialog.showModal();
  render();
  $('#v-close').focus();
}

const current = () => list?.items[index];
const mine = (work) => 'generation_id' in work;

async function step(by) {
  let next = index + by;
  if (next >= list.items.length && list.hasMore) {
    await list.more();
  }
  if (next < 0 || next >= list.items.length) return;
  index = next;
  render();
}

function render() {
  const work = current();
  if (!work) { dialog.close(); return; }
  round += 1;
  errorBox.textContent = '';
  const [w, hgt] = [work.width, work.height];
  media.replaceChildren(work.kind === 'video'
    ? h('video', { src: work.media_url, poster: work.thumb_url, controls: true, playsinline: true, preload: 'metadata', width: w, height: hgt, 'aria-label': work.prompt })
    : h('img', { src: work.media_url, alt: work.prompt, width: w, height: hgt }),
    aiBadge());
  const rows = [
    ['prompt', work.prompt],
    ['model', modelName(work.model)],
    ['size', `${w}×${hgt}`],
  ];
  if (work.kind === 'video' && work.duration) rows.push(['duration', t('seconds', { s: Math.round(work.duration * 10) / 10 })]);
  rows.push(['favorites', formatNumber(work.favorites ?? 0)]);
  if (work.removed_at) rows.push(['removed', formatDate(work.removed_at)]);
  if (work.published_at) rows.push(['published', formatDate(work.published_at)]);
  else if (work.created_at) rows.push(['created', formatDate(work.created_at)]);
  meta.replaceChildren(...rows.flatMap(([key, value]) => [h('dt', { text: t(key) }), h('dd', { text: value })]));
  $('#v-prev').disabled = index === 0;
  $('#v-next').disabled = index >= list.items.length - 1 && !list.hasMore;
  renderActions(work);
  // The square does not say whether I favorited a work, or whether it is mine: ask.
  if (state.user && !('favorite' in work)) refresh(work.id, round);
}

async function refresh(id, asked) {
  try {
    const fresh = await get(`/works/${encodeURIComponent(id)}`);
    changed(fresh, asked);
  } catch { /* keep what the list showed */ }
}

function changed(work, asked = round) {
  list.update(work);
  emit('work-changed', work);
  if (asked === round && current()?.id === work.id) renderActions(current());
}

function renderActions(work) {
  // Redrawn after every change: keep the focus on the same action.
  const focused = actions.contains(document.activeElement) ? document.activeElement.dataset.action : null;
  const buttons = [];
  const fav = h('button', {
    type: 'button', 'aria-pressed': String(Boolean(work.favorite)), text: t('favorite'), dataset: { action: 'favorite' },
    on: { click: () => requireSession(() => toggleFavorite(fav)) },
  });
  buttons.push(fav);
  buttons.push(h('button', { type: 'button', text: t('use_prompt'), dataset: { action: 'prompt' }, on: { click: () => usePrompt(work) } }));
  if (mine(work)) {
    buttons.push(h('button', { type: 'button', text: t('run_again'), dataset: { action: 'again' }, on: { click: () => runAgain(work) } }));
    if (!work.removed_at) {
      buttons.push(h('button', {
        type: 'button', text: work.published_at ? t('unpublish') : t('publish'), dataset: { action: 'publish' },
        on: { click: (e) => publish(e.currentTarget, !work.published_at) },
      }));
    }
    buttons.push(h('a', { href: work.media_url, download: fileName(work), text: t('download'), dataset: { action: 'download' } }));
    buttons.push(...collectionActions(work));
    buttons.push(h('button', { type: 'button', class: 'danger', text: t('delete'), dataset: { action: 'delete' }, on: { click: () => remove(work) } }));
  }
  if (work.published_at) buttons.push(h('a', { href: `/square/${encodeURIComponent(work.id)}`, text: t('open_page'), dataset: { action: 'page' } }));
  if (work.published_at && !mine(work)) {
    buttons.push(h('button', { type: 'button', class: 'quiet', text: t('report'), dataset: { action: 'report' }, on: { click: (e) => openReport(work, e.currentTarget) } }));
  }
  actions.replaceChildren(...buttons);
  const again = focused && [...actions.children].find((el) => el.dataset.action === focused);
  if (again) again.focus();
  else if (focused) dialog.focus();
}

/** Add to one of my collections (a choice and a button); take out of the one shown. */
function collectionActions(work) {
  const out = [];
  if (shelf.items.length) {
    const pick = h('select', { 'aria-label': t('collection_pick'), dataset: { action: 'pick' } },
      shelf.items.map((c) => h('option', { value: c.id, text: c.name })));
    out.push(h('span', { class: 'keep' }, pick, h('button', {
      type: 'button', text: t('add_to_collection'), dataset: { action: 'keep' },
      on: { click: () => intoCollection(work, shelf.items.find((c) => c.id === pick.value), true) },
    })));
  }
  const shown = currentCollection();
  if (shown && list?.collection === shown.id) {
    out.push(h('button', {
      type: 'button', text: t('remove_from_collection', { name: shown.name }), dataset: { action: 'unkeep' },
      on: { click: () => intoCollection(work, shown, false) },
    }));
  }
  return out;
}

async function intoCollection(work, collection, into) {
  if (!collection) return;
  try {
    await keep(collection, work.id, into);
    toast(t(into ? 'toast_added' : 'toast_removed_from', { name: collection.name }));
    if (!into) drop(work); else renderActions(work);
  } catch (error) {
    errorBox.textContent = describe(error);
  }
}

/** The work left the list shown (deleted, or taken out of it): show the next one. */
function drop(work) {
  list.remove(work.id);
  if (index >= list.items.length) index = list.items.length - 1;
  if (index < 0) dialog.close(); else render();
}

function fileName(work) {
  const ext = (work.content_type || '').split('/')[1] || 'bin';
  return `liuguang-${work.id}.${ext === 'jpeg' ? 'jpg' : ext}`;
}

async function toggleFavorite(button) {
  let work = current();
  if (!work) return;
  button.disabled = true;
  try {
    // Signed in just now from the square: learn first whether it already is one.
    if (!('favorite' in work)) {
      work = { ...work, ...(await get(`/works/${encodeURIComponent(work.id)}`)) };
    }
    const on = !work.favorite;
    await api(on ? 'PUT' : 'DELETE', `/works/${encodeURIComponent(work.id)}/favorite`);
    const count = Math.max(0, (work.favorites ?? 0) + (on ? 1 : -1));
    changed({ ...work, favorite: on, favorites: count });
    render();
    emit('favorites-stale');
  } catch (error) {
    errorBox.textContent = describe(error);
  } finally {
    button.disabled = false;
  }
}

async function publish(button, on) {
  const work = current();
  button.disabled = true;
  try {
    const fresh = await api(on ? 'POST' : 'DELETE', `/works/${encodeURIComponent(work.id)}/publish`);
    changed(fresh);
    render();
    emit('square-stale');
    toast(t(on ? 'toast_published' : 'toast_unpublished'));
  } catch (error) {
    errorBox.textContent = describe(error);
    button.disabled = false;
  }
}

async function remove(work) {
  if (!(await ask(t('confirm_delete')))) return;
  try {
    await api('DELETE', `/works/${encodeURIComponent(work.id)}`);
    drop(work);
    emit('work-removed', work.id);
    toast(t('toast_deleted'));
  } catch (error) {
    errorBox.textContent = describe(error);
  }
}

function usePrompt(work) {
  emit('prefill', { model: work.model, prompt: work.prompt, size: `${work.width}x${work.height}` });
  dialog.close();
  location.hash = '#create';
  toast(t('toast_prompt'));
}

async function runAgain(work) {
  try {
    const g = await get(`/generations/${encodeURIComponent(work.generation_id)}`);
    emit('prefill', {
      model: g.model, prompt: g.prompt, negative_prompt: g.negative_prompt,
      size: g.size, count: g.count, seed: g.seed, reference: g.reference,
    });
    dialog.close();
    location.hash = '#create';
    toast(t('toast_again'));
  } catch (error) {
    errorBox.textContent = describe(error);
  }
}

$('#v-prev').addEventListener('click', () => step(-1));
$('#v-next').addEventListener('click', () => step(1));
$('#v-close').addEventListener('click', () => dialog.close());
document.addEventListener('keydown', (event) => {
  if (!dialog.open || $('#confirm').open || $('#signin').open || $('#report').open) return;
  if (event.target instanceof HTMLVideoElement || event.target instanceof HTMLInputElement) return;
  if (event.key === 'ArrowLeft') { event.preventDefault(); step(-1); }
  if (event.key === 'ArrowRight') { event.preventDefault(); step(1); }
});
// A click on the backdrop (the dialog box itself, outside its content) closes it.
dialog.addEventListener('click', (event) => { if (event.target === dialog) dialog.close(); });
dialog.addEventListener('close', () => {
  media.replaceChildren();
  round += 1;
  if (opener?.isConnected) opener.focus();
});
onLang(() => { if (dialog.open) render(); });
