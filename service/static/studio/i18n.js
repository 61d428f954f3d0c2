// Both languages come with the page (a JSON data block); the choice is remembered.
const STORE = 'studio.lang';
const strings = JSON.parse(document.getElementById('strings').textContent);
const listeners = new Set();

function initial() {
  try {
    const saved = localStorage.getItem(STORE);
    if (saved === 'zh' || saved === 'en') return saved;
  } catch { /* storage may be off: fall through */ }
  return (navigator.language || 'zh').toLowerCase().startsWith('zh') ? 'zh' : 'en';
}

let lang = initial();

export const currentLang = () => lang;
export const locale = () => (lang === 'zh' ? 'zh-CN' : 'en');

/** Look a key up in the current language and fill in {names}. */
export function t(key, vars = {}) {
  const text = strings[lang][key] ?? strings.zh[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (_, name) => (name in vars ? String(vars[name]) : `{${name}}`));
}

/** Re-label every element that names its text by key (data-t, data-t-label, ...). */
export function translate(root = document) {
  for (const el of root.querySelectorAll('[data-t]')) el.textContent = t(el.dataset.t);
  for (const el of root.querySelectorAll('[data-t-label]')) el.setAttribute('aria-label', t(el.dataset.tLabel));
  for (const el of root.querySelectorAll('[data-t-placeholder]')) el.placeholder = t(el.dataset.tPlaceholder);
}

export function setLang(next) {
  lang = next === 'en' ? 'en' : 'zh';
  try { localStorage.setItem(STORE, lang); } catch { /* not remembered, still switched */ }
  apply();
  for (const fn of listeners) fn(lang);
}

export function onLang(fn) { listeners.add(fn); }

function apply() {
  document.documentElement.lang = lang === 'zh' ? 'zh-Hans' : 'en';
  translate();
}

export function formatDate(iso, withTime = true) {
  if (!iso) return '';
  const options = withTime ? { dateStyle: 'medium', timeStyle: 'short' } : { dateStyle: 'medium' };
  return new Intl.DateTimeFormat(locale(), options).format(new Date(iso));
}

export const formatNumber = (n) => new Intl.NumberFormat(locale()).format(n);

apply();
