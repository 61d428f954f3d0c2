// A grid of thumbnails that loads the next page as its end scrolls into view.
import { h } from './dom.js';
import { t } from './i18n.js';
import { describe } from './api.js';

/**
 * A tile's classes. A work that is not square (every clip's poster, a wide or tall
 * picture) is shown whole, letterboxed: a square crop would cut off the corner
 * where its burnt-in AI生成 mark is.
 */
export function tileClass(work) {
  const whole = work.kind === 'video' || work.width !== work.height;
  return `tile${work.kind === 'video' ? ' video' : ''}${whole ? ' whole' : ''}`;
}

/**
 * A tile's kind and state, in a row at its bottom-left: the bottom-right is where a
 * picture's own burnt-in AI生成 mark is, and nothing of ours may cover it.
 */
export function tileTags(work, published = false) {
  const tags = [
    work.kind === 'video' ? h('span', { class: 'badge', text: t('video_badge', { s: Math.round(work.duration || 0) }) }) : null,
    published ? h('span', { class: 'flag', text: t('published_badge') }) : null,
  ].filter(Boolean);
  return tags.length ? h('span', { class: 'tags' }, tags) : null;
}

/** The AI-generated badge every work shows beside it (CONTRACT §10). */
export function aiBadge() {
  return h('span', { class: 'ai-badge', text: t('ai_badge'), title: t('ai_badge_title') });
}

const MARGIN = 800;

export class Feed {
  /**
   * grid/status/sentinel: elements; load(cursor) → {items, next_cursor};
   * open(feed, index, opener): show one item; empty: key of the empty message.
   */
  constructor({ grid, status, sentinel, load, open, empty }) {
    Object.assign(this, { grid, status, sentinel, load, open, empty });
    this.items = [];
    this.cursor = null;
    this.done = false;
    this.loading = false;
    this.active = false;
    this.stale = true;
    this.round = 0;
    new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.more();
    }, { rootMargin: `${MARGIN}px 0px` }).observe(sentinel);
  }

  /** Start again from the first page (a filter changed, or the list did). */
  reset() {
    this.round += 1;
    this.items = [];
    this.cursor = null;
    this.done = false;
    this.loading = false;
    this.stale = false;
    this.grid.replaceChildren();
    return this.more();
  }

  /** Forget everything shown (another person signed in, or nobody). */
  clear() {
    this.round += 1;
    this.items = [];
    this.cursor = null;
    this.done = false;
    this.loading = false;
    this.stale = true;
    this.grid.replaceChildren();
    this.setStatus('');
  }

  show() {
    this.active = true;
    if (this.stale) return this.reset();
    return this.fill();
  }

  hide() { this.active = false; }

  get hasMore() { return !this.done; }

  async more() {
    if (this.loading || this.done || !this.active) return;
    this.loading = true;
    const round = this.round;
    this.setStatus(t('loading'));
    try {
      const page = await this.load(this.cursor);
      if (round !== this.round) return;
      const start = this.items.length;
      this.items.push(...page.items);
      this.grid.append(...page.items.map((item, i) => this.tile(item, start + i)));
      this.cursor = page.next_cursor;
      this.done = !page.next_cursor;
      this.setStatus(this.done && !this.items.length ? t(this.empty) : '');
    } catch (error) {
      if (round !== this.round) return;
      this.setStatus(describe(error), true);
    } finally {
      if (round === this.round) this.loading = false;
    }
    if (round === this.round) this.fill();
  }

  /** Keep loading while the end of the grid is on (or near) the screen. */
  fill() {
    if (this.done || this.loading || !this.active) return;
    if (this.sentinel.getBoundingClientRect().top < innerHeight + MARGIN) this.more();
  }

  setStatus(text, retry = false) {
    this.status.replaceChildren(text);
    if (retry) {
      this.status.append(' ', h('button', { type: 'button', class: 'quiet', text: t('load_more'), on: { click: () => this.more() } }));
    }
  }

  tile(work, index) {
    const label = work.prompt.length > 120 ? `${work.prompt.slice(0, 119)}…` : work.prompt;
    return h('li', { dataset: { id: work.id } },
      h('button', {
        type: 'button', class: tileClass(work),
        on: { click: (event) => this.open(this, this.indexOf(work.id, index), event.currentTarget) },
      },
      h('img', { src: work.thumb_url, alt: label, loading: 'lazy', decoding: 'async', width: 512, height: 512 }),
      aiBadge(),
      tileTags(work, work.published_at && 'generation_id' in work)));
  }

  indexOf(id, hint) {
    return this.items[hint]?.id === id ? hint : this.items.findIndex((w) => w.id === id);
  }

  /** Replace one item (published, favorited); redraw its tile. */
  update(work) {
    const i = this.items.findIndex((w) => w.id === work.id);
    if (i < 0) return;
    this.items[i] = { ...this.items[i], ...work };
    const li = this.grid.children[i];
    if (li) li.replaceWith(this.tile(this.items[i], i));
  }

  remove(id) {
    const i = this.items.findIndex((w) => w.id === id);
    if (i < 0) return;
    this.items.splice(i, 1);
    this.grid.children[i]?.remove();
    if (!this.items.length && this.done) this.setStatus(t(this.empty));
  }

  /** Redraw every tile (the language changed). */
  redraw() {
    this.grid.replaceChildren(...this.items.map((w, i) => this.tile(w, i)));
    if (this.done && !this.items.length) this.setStatus(t(this.empty));
  }
}

/** A fixed list (a job's works) with the same face as a Feed, for the viewer. */
export class List {
  constructor(items) { this.items = items; }
  get hasMore() { return false; }
  async more() {}
  update(work) {
    const i = this.items.findIndex((w) => w.id === work.id);
    if (i >= 0) this.items[i] = { ...this.items[i], ...work };
  }
  remove(id) { this.items = this.items.filter((w) => w.id !== id); }
}
