// The workbench's entry: header, views by URL fragment, and who listens to what.
import { $, $$, h, toast } from './dom.js';
import { t, currentLang, setLang, onLang, formatNumber } from './i18n.js';
import { get, describe } from './api.js';
import { state, on, emit, loadSession, loadModels, signOut, modelName } from './state.js';
import { openSignIn, requireSession } from './auth.js';
import { Feed } from './feed.js';
import { openViewer } from './viewer.js';
import { shown as createShown } from './create.js';
import { showCredits, hideCredits } from './credits.js';
import { showBuy, hideBuy } from './buy.js';
import { showAccount, hideAccount, accountGone } from './account.js';
import { statusText, tryAgain } from './jobs.js';
import { shelf, loadCollections } from './collections.js';
import './daily.js';

const VIEWS = ['square', 'create', 'works', 'favorites', 'credits', 'buy', 'account'];
const PRIVATE = new Set(['works', 'favorites', 'credits', 'buy', 'account']);
// A private view that needs a sign-in now (the account view of a deleted account says more).
const locked = (name) => PRIVATE.has(name) && !state.user && !(name === 'account' && accountGone());
const square = { kind: '', sort: 'new' };
// What My works shows: words its prompts hold (q), and one collection (or all).
const library = { q: '' };

function query(params) {
  const out = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value) out.set(key, value);
  return out.toString();
}

const feeds = {
  square: new Feed({
    grid: $('#square-grid'), status: $('#square-status'), sentinel: $('#square-more'), empty: 'empty_square',
    load: (cursor) => get(`/square?${query({ ...square, limit: 24, cursor })}`),
    open: openViewer,
  }),
  works: new Feed({
    grid: $('#works-grid'), status: $('#works-status'), sentinel: $('#works-more'), empty: 'works_empty',
    load: (cursor) => get(`/works?${query({ limit: 24, cursor, q: library.q, collection: shelf.current })}`),
    open: openViewer,
  }),
  favorites: new Feed({
    grid: $('#favorites-grid'), status: $('#favorites-status'), sentinel: $('#favorites-more'), empty: 'favorites_empty',
    load: (cursor) => get(`/favorites?${query({ limit: 24, cursor })}`),
    open: openViewer,
  }),
};

let view = null;

function route(moveFocus = true) {
  const name = VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : 'square';
  const changed = name !== view;
  view = name;
  for (const other of VIEWS) $(`#view-${other}`).hidden = other !== name;
  for (const link of $$('.tabs a')) {
    if (link.dataset.view === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  for (const [link, own] of [['#buy-link', 'buy'], ['#account-link', 'account']]) {
    if (name === own) $(link).setAttribute('aria-current', 'page');
    else $(link).removeAttribute('aria-current');
  }
  for (const [key, feed] of Object.entries(feeds)) if (key !== name) feed.hide();
  if (name !== 'credits') hideCredits();
  if (name !== 'buy') hideBuy();
  if (name !== 'account' || !state.user) hideAccount();
  if (locked(name)) {
    $(`#${name === 'credits' ? 'credits' : name}-status`).textContent = t('signin_needed');
    if (changed && state.ready) requireSession(() => route(false));
  } else if (feeds[name]) {
    feeds[name].show();
    if (name === 'works') loadCollections();
  } else if (name === 'credits') {
    showCredits();
  } else if (name === 'buy') {
    showBuy();
  } else if (name === 'account') {
    showAccount();
  }
  if (changed && moveFocus) {
    if (name === 'create' && createShown()) return;
    const heading = $(`#view-${name} h1`);
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}

// Header: balance, sign in/out, language.
function renderUser() {
  const signedIn = Boolean(state.user);
  $('#signin-button').hidden = signedIn;
  $('#signout-button').hidden = !signedIn;
  $('#balance').hidden = !signedIn;
  $('#buy-link').hidden = !signedIn;
  $('#account-link').hidden = !signedIn;
  renderBalance();
}

function renderBalance() {
  $('#balance-value').textContent = state.balance === null ? '' : formatNumber(state.balance);
}

$('#signin-button').addEventListener('click', () => openSignIn(false));
$('#signout-button').addEventListener('click', async () => {
  try {
    await signOut();
    toast(t('signed_out'));
  } catch (error) {
    toast(describe(error));
  }
});
const lang = $('#lang');
lang.value = currentLang();
lang.addEventListener('change', () => setLang(lang.value));

for (const input of $$('#view-square input[type=radio]')) {
  input.addEventListener('change', () => {
    square[input.name] = input.value;
    feeds.square.reset();
  });
}

on('user', () => {
  renderUser();
  library.q = '';
  $('#works-q').value = '';
  $('#works-q-clear').hidden = true;
  $('#works-jobs-section').hidden = true;
  feeds.works.clear();
  feeds.favorites.clear();
  if (state.ready) route(false);
});
on('balance', renderBalance);
on('work-changed', (work) => { for (const feed of Object.values(feeds)) feed.update(work); });
on('work-removed', (id) => { for (const feed of Object.values(feeds)) feed.remove(id); });
on('works-stale', () => { feeds.works.stale = true; if (view === 'works') feeds.works.reset(); });
on('favorites-stale', () => { feeds.favorites.stale = true; });
on('square-stale', () => { feeds.square.stale = true; });
onLang(() => {
  renderBalance();
  if (library.q) findJobs();
  for (const feed of Object.values(feeds)) feed.redraw();
  if (locked(view)) $(`#${view}-status`).textContent = t('signin_needed');
});
addEventListener('hashchange', () => route());

// My works: a search over its works and my jobs; a collection narrows the works.
const found = $('#works-jobs');
function reloadWorks() {
  const works = feeds.works;
  works.collection = shelf.current;
  works.empty = library.q ? 'search_empty' : shelf.current ? 'collection_empty' : 'works_empty';
  works.stale = true;
  if (view === 'works' && state.user) works.reset();
}

async function findJobs() {
  const section = $('#works-jobs-section');
  section.hidden = !library.q;
  found.replaceChildren();
  if (!library.q) return;
  const status = $('#works-jobs-status');
  status.textContent = t('loading');
  try {
    const page = await get(`/generations?${query({ q: library.q, limit: 20 })}`);
    found.replaceChildren(...page.items.map((g) => h('li', { class: 'job', dataset: { id: g.id, status: g.status } },
      h('div', { class: 'job-head' },
        h('span', { class: 'job-model', text: modelName(g.model) }),
        h('span', { class: 'job-status', text: statusText(g) })),
      h('p', { class: 'job-prompt', text: g.prompt }),
      ['failed', 'canceled'].includes(g.status)
        ? h('button', { type: 'button', class: 'job-retry', text: t('try_again'), on: { click: (e) => tryAgain(g, e.currentTarget) } })
        : null,
      h('p', { class: 'error', role: 'alert' }))));
    status.textContent = page.items.length ? '' : t('search_no_jobs');
  } catch (error) {
    status.textContent = describe(error);
  }
}

$('#works-search').addEventListener('submit', (event) => {
  event.preventDefault();
  library.q = $('#works-q').value.trim().slice(0, 100);
  $('#works-q-clear').hidden = !library.q;
  reloadWorks();
  findJobs();
});
$('#works-q-clear').addEventListener('click', () => {
  $('#works-q').value = '';
  library.q = '';
  $('#works-q-clear').hidden = true;
  reloadWorks();
  findJobs();
  $('#works-q').focus();
});
on('collection-chosen', reloadWorks);

// A work's own page links "Use this prompt" here as #use=<id>: Create, filled in.
const USE = /^#use=([A-Za-z0-9]{1,64})$/;
async function useFromSquare(id, models) {
  try {
    const work = await get(`/square/${id}`);
    await models;
    emit('prefill', { model: work.model, prompt: work.prompt, size: `${work.width}x${work.height}` });
    createShown();
    toast(t('toast_prompt'));
  } catch (error) {
    toast(describe(error));
  }
}

async function boot() {
  renderUser();
  const models = loadModels().catch((error) => toast(describe(error)));
  const use = USE.exec(location.hash);
  if (use) {
    history.replaceState(null, '', '#create');
    useFromSquare(use[1], models);
  }
  try {
    await loadSession();
  } catch (error) {
    state.ready = true;
    toast(describe(error));
  }
  route(false);
  await models;
}

boot();
