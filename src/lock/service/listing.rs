//! Listings on [`Locks`]: one page of a walk over several prefixes, one
//! after another (an API key's prefixes, when no prefix is asked for; see
//! [`crate::auth::ListScope`]), each walked by the store.

use super::Locks;
use crate::lock::LockError;
use crate::lock::listing::{
    LockEntry, NamePrefix, Page, PageSize, Position, RunEntry, SemaphoreEntry, Walked,
};

/// Where one page of the walk of `prefixes` from `from` goes: the prefix
/// to walk (its index, and the store's position in it), or `None` when
/// there is no prefix to walk (a key none of whose prefixes can start a
/// name: nothing to list). A page covers one prefix at most, so that its
/// cost stays that of one store page.
fn step(
    prefixes: &[NamePrefix],
    from: (usize, Position),
) -> Result<Option<(&NamePrefix, usize, Position)>, LockError> {
    let (index, at) = from;
    match prefixes.get(index) {
        Some(prefix) => Ok(Some((prefix, index, at))),
        None if index == 0 && at == Position::Start => Ok(None),
        None => Err(LockError::BadCursor),
    }
}

/// The store's page of the `index`-th of `count` prefixes, as a page of
/// the whole walk.
fn walked<T>(page: Page<T>, index: usize, count: usize) -> Walked<T> {
    let next = match page.next {
        Some(at) => Some((index, at)),
        None => (index + 1 < count).then_some((index + 1, Position::Start)),
    };
    Walked {
        items: page.items,
        next,
    }
}

/// The walk of no prefix at all.
fn nothing<T>() -> Walked<T> {
    Walked {
        items: Vec::new(),
        next: None,
    }
}

impl Locks {
    /// One page of the held locks under `prefixes`, walked one after
    /// another, from `from` (the index of the prefix and the store's
    /// position in it; `(0, Start)` to begin). Never a token.
    ///
    /// # Errors
    /// [`LockError::BadCursor`] when `from` does not fit; as for
    /// [`crate::lock::LockStore::list_locks`].
    pub async fn list_locks(
        &self,
        prefixes: &[NamePrefix],
        from: (usize, Position),
        limit: PageSize,
    ) -> Result<Walked<LockEntry>, LockError> {
        let Some((prefix, index, at)) = step(prefixes, from)? else {
            return Ok(nothing());
        };
        let page = self.store.locks().list_locks(prefix, &at, limit).await?;
        Ok(walked(page, index, prefixes.len()))
    }

    /// As [`Self::list_locks`], for the semaphores with a permit held.
    ///
    /// # Errors
    /// As for [`crate::lock::SemaphoreStore::list_semaphores`] (Redlock has no
    /// semaphores).
    pub async fn list_semaphores(
        &self,
        prefixes: &[NamePrefix],
        from: (usize, Position),
        limit: PageSize,
    ) -> Result<Walked<SemaphoreEntry>, LockError> {
        let Some((prefix, index, at)) = step(prefixes, from)? else {
            return Ok(nothing());
        };
        let page = self
            .store
            .semaphores()?
            .list_semaphores(prefix, &at, limit)
            .await?;
        Ok(walked(page, index, prefixes.len()))
    }

    /// As [`Self::list_locks`], for the runs kept (running, done or
    /// pending).
    ///
    /// # Errors
    /// As for [`crate::lock::RunStore::list_runs`] (Redlock has no runs).
    pub async fn list_runs(
        &self,
        prefixes: &[NamePrefix],
        from: (usize, Position),
        limit: PageSize,
    ) -> Result<Walked<RunEntry>, LockError> {
        let Some((prefix, index, at)) = step(prefixes, from)? else {
            return Ok(nothing());
        };
        let page = self.store.runs()?.list_runs(prefix, &at, limit).await?;
        Ok(walked(page, index, prefixes.len()))
    }
}
