//! A rendered page kept while what it was rendered from has not changed: the
//! `/api/v1/calibration` ledger (several MB at the seed's shape) is rendered once per store
//! generation and held verdict, as `matrix_cache` encodes `/metrics`' store part once per
//! generation, instead of at every request. A [`Page`] holds the body and, once a client has
//! asked for gzip, its compressed form.

use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Bytes;

/// A rendered page body.
#[derive(Debug)]
pub struct Page {
    body: Bytes,
    gzip: OnceLock<Bytes>,
}

impl Page {
    pub fn new(body: String) -> Page {
        Page {
            body: Bytes::from(body),
            gzip: OnceLock::new(),
        }
    }

    /// The body, sharing the page's buffer.
    pub fn body(&self) -> Bytes {
        self.body.clone()
    }

    /// The body in the gzip coding, compressed the first time it is asked for.
    pub fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| Bytes::from(super::content_coding::gzip(&self.body)))
            .clone()
    }
}

/// The latest page and the key it was rendered for.
#[derive(Debug)]
pub struct PageCache<K> {
    latest: Mutex<Option<(K, Arc<Page>)>>,
}

impl<K> Default for PageCache<K> {
    fn default() -> Self {
        PageCache {
            latest: Mutex::new(None),
        }
    }
}

impl<K: PartialEq> PageCache<K> {
    /// The page rendered for `key`: the kept one when its key is equal, else `render`'s,
    /// which is kept in its place. Requests that find no page at once render it each (the
    /// lock is not held while rendering); the last one stays.
    pub fn get(&self, key: K, render: impl FnOnce() -> String) -> Arc<Page> {
        if let Some((k, page)) = &*self.latest.lock().unwrap_or_else(|p| p.into_inner()) {
            if *k == key {
                return page.clone();
            }
        }
        let page = Arc::new(Page::new(render()));
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((key, page.clone()));
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_page_is_rendered_again_only_when_its_key_changes() {
        let cache = PageCache::default();
        let renders = Cell::new(0);
        let render = |text: &str| {
            renders.set(renders.get() + 1);
            text.to_string()
        };
        let a = cache.get((1u64, "ok"), || render("one"));
        let b = cache.get((1u64, "ok"), || render("two"));
        assert_eq!(
            (a.body(), b.body()),
            (Bytes::from("one"), Bytes::from("one"))
        );
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(renders.get(), 1);
        let c = cache.get((1u64, "degraded"), || render("three"));
        assert_eq!(c.body(), Bytes::from("three"));
        let d = cache.get((2u64, "degraded"), || render("four"));
        assert_eq!(d.body(), Bytes::from("four"));
        assert_eq!(renders.get(), 3);
        let mut text = String::new();
        flate2::read::GzDecoder::new(&d.gzip()[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "four");
        assert_eq!(d.gzip(), d.gzip(), "compressed once, shared");
    }

    use std::io::Read;
}
