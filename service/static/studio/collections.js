// My collections: browse one, make, rename and delete them; the viewer fills them.
import { $, h, toast, ask } from './dom.js';
import { t, formatNumber, onLang } from './i18n.js';
import { api, get, describe } from './api.js';
import { state, on, emit } from './state.js';

/** The collections I have (newest first) and the one the works view shows (or null). */
export const shelf = { items: [], current: null };
const chips = $('#collection-list');
const tools = $('#collection-tools');
const errorBox = $('#collection-error');
const newName = $('#collection-name');
const renameForm = $('#collection-rename');
const renameInput = $('#collection-newname');

export const currentCollection = () => shelf.items.find((c) => c.id === shelf.current) || null;

export async function loadCollections() {
  if (!state.user) return;
  try {
    shelf.items = (await get('/collections')).collections;
  } catch (error) {
    errorBox.textContent = describe(error);
  }
  if (shelf.current && !currentCollection()) choose(null);
  render();
}

function render() {
  const focused = chips.contains(document.activeElement) ? document.activeElement.dataset.id : null;
  const all = [{ id: '', label: t('collection_all') }, ...shelf.items.map((c) => ({
    id: c.id, label: t('collection_chip', { name: c.name, n: formatNumber(c.count) }),
  }))];
  chips.replaceChildren(...all.map(({ id, label }) => h('button', {
    type: 'button', class: 'chip', text: label, dataset: { id },
    'aria-pressed': String((shelf.current || '') === id),
    on: { click: () => choose(id || null) },
  })));
  if (focused !== null) chips.querySelector(`[data-id="${CSS.escape(focused)}"]`)?.focus();
  tools.hidden = !currentCollection();
  if (tools.hidden) renameForm.hidden = true;
}

function choose(id) {
  if (shelf.current === id) return;
  shelf.current = id;
  errorBox.textContent = '';
  render();
  emit('collection-chosen', id);
}

$('#collection-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  errorBox.textContent = '';
  const name = newName.value.trim();
  if (!name) { newName.focus(); return; }
  try {
    const made = await api('POST', '/collections', { json: { name } });
    shelf.items.unshift(made);
    newName.value = '';
    toast(t('toast_collection_made', { name: made.name }));
    render();
  } catch (error) {
    errorBox.textContent = describe(error);
  }
});

$('#collection-rename-start').addEventListener('click', () => {
  renameForm.hidden = false;
  renameInput.value = currentCollection()?.name || '';
  renameInput.focus();
  renameInput.select();
});

renameForm.addEventListener('submit', async (event) => {
  event.preventDefault();
  const chosen = currentCollection();
  const name = renameInput.value.trim();
  if (!chosen || !name) return;
  try {
    Object.assign(chosen, await api('PATCH', `/collections/${encodeURIComponent(chosen.id)}`, { json: { name } }));
    renameForm.hidden = true;
    render();
    chips.querySelector(`[data-id="${CSS.escape(chosen.id)}"]`)?.focus();
  } catch (error) {
    errorBox.textContent = describe(error);
  }
});

$('#collection-delete').addEventListener('click', async () => {
  const chosen = currentCollection();
  if (!chosen || !(await ask(t('confirm_delete_collection', { name: chosen.name })))) return;
  try {
    await api('DELETE', `/collections/${encodeURIComponent(chosen.id)}`);
    shelf.items = shelf.items.filter((c) => c.id !== chosen.id);
    toast(t('toast_collection_deleted'));
    choose(null);
    chips.firstElementChild?.focus();
  } catch (error) {
    errorBox.textContent = describe(error);
  }
});

/** Put a work of mine in a collection, or take it out; the counts follow. */
export async function keep(collection, workId, into) {
  await api(into ? 'PUT' : 'DELETE', `/collections/${encodeURIComponent(collection.id)}/works/${encodeURIComponent(workId)}`);
  await loadCollections();
}

on('user', () => { shelf.items = []; shelf.current = null; render(); });
onLang(render);
