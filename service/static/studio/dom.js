// Build DOM from data without ever parsing strings as HTML: text goes in as text.

/**
 * Create an element. `props`: `class`, `text`, `on` ({event: handler}),
 * `dataset`, and any other key as a property (if it exists) or an attribute.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = String(value);
    else if (key === 'on') for (const [name, fn] of Object.entries(value)) el.addEventListener(name, fn);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('aria-') || key === 'role' || key === 'for' || !(key in el)) el.setAttribute(key, value === true ? '' : String(value));
    else el[key] = value;
  }
  el.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

export const $ = (selector, root = document) => root.querySelector(selector);
export const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

let toastTimer = 0;
/** Say something briefly in the live region at the bottom of the page. */
export function toast(message) {
  const box = $('#toast');
  box.textContent = message;
  box.classList.add('show');
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => box.classList.remove('show'), 4000);
}

/** Random hex for Idempotency-Key: getRandomValues works outside secure contexts too. */
export function randomKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** Ask in the confirm dialog; resolves true for "yes". */
export function ask(text) {
  const confirm = $('#confirm');
  $('#confirm-text').textContent = text;
  confirm.returnValue = '';
  confirm.showModal();
  return new Promise((resolve) => confirm.addEventListener('close', () => resolve(confirm.returnValue === 'yes'), { once: true }));
}
