//! What `GET /locks` and `GET /semaphores` share: their query parameters
//! (`prefix`, `limit`, `cursor`), parsed strictly into the lock core's
//! types under the caller's [`ListScope`], and the `next_cursor` of an
//! answer. (The schemas the OpenAPI document shows for them are in
//! [`super::locks::model`].)

use serde::Deserialize;

use super::problem::{self, ApiError};
use crate::auth::ListScope;
use crate::lock::Kind;
use crate::lock::listing::{Cursor, NamePrefix, PageSize, Position};

/// Query parameters of `GET /locks` and `GET /semaphores`, as given: each
/// at most once, no other.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The start of the names to list.
    pub prefix: Option<String>,
    /// The most items of the page, as decimal digits.
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A listing request, parsed.
#[derive(Debug)]
pub struct ListRequest {
    kind: Kind,
    /// The prefix asked for (empty: none), which the cursors carry.
    asked: String,
    /// The prefixes walked, one after another.
    pub prefixes: Vec<NamePrefix>,
    /// Where the walk starts: the index of the prefix and the store's
    /// position in it.
    pub from: (usize, Position),
    /// The page size.
    pub limit: PageSize,
}

impl ListRequest {
    /// Parses `query` for a listing of `kind` by a caller who may list
    /// `scope`. An empty `prefix` is no prefix. A caller limited to some
    /// prefixes (an API key's) who asks for none walks its own, one after
    /// another.
    ///
    /// # Errors
    /// 400 for a prefix no name can start with, a `limit` out of `1..=1000`
    /// or a cursor this listing did not give; 403 for a prefix outside the
    /// caller's.
    pub fn parse(kind: Kind, query: ListQuery, scope: &ListScope) -> Result<Self, ApiError> {
        let asked = query.prefix.unwrap_or_default();
        NamePrefix::parse(&asked)?;
        let limit = query
            .limit
            .as_deref()
            .map(PageSize::parse_text)
            .transpose()?
            .unwrap_or(PageSize::DEFAULT);
        let prefixes: Vec<NamePrefix> = scope
            .prefixes(&asked)
            .map_err(|e| ApiError::new(problem::Kind::Forbidden, e.to_string()))?
            .iter()
            // A key's prefix that no name can start with lists nothing.
            .filter_map(|p| NamePrefix::parse(p).ok())
            .collect();
        let from = match query.cursor.as_deref() {
            None => (0, Position::Start),
            Some(raw) => Cursor::parse(raw, kind, &asked, prefixes.len())?,
        };
        Ok(Self {
            kind,
            asked,
            prefixes,
            from,
            limit,
        })
    }

    /// The `next_cursor` of a page whose walk goes on at `next`.
    pub fn next_cursor(&self, next: Option<(usize, Position)>) -> Option<String> {
        next.map(|(scope, at)| Cursor::new(self.kind, &self.asked, scope, at).encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(prefix: Option<&str>, limit: Option<&str>, cursor: Option<&str>) -> ListQuery {
        ListQuery {
            prefix: prefix.map(str::to_owned),
            limit: limit.map(str::to_owned),
            cursor: cursor.map(str::to_owned),
        }
    }

    fn kind(result: Result<ListRequest, ApiError>) -> Option<problem::Kind> {
        result.err().map(|e| e.kind())
    }

    #[test]
    fn bad_input_is_refused_and_a_key_lists_under_its_prefixes() {
        let every = ListScope::Every;
        let ok = ListRequest::parse(Kind::Lock, query(None, None, None), &every).expect("valid");
        assert_eq!(ok.limit, PageSize::DEFAULT);
        assert_eq!(ok.prefixes, [NamePrefix::default()]);
        for (prefix, limit, cursor) in [
            (Some("a b"), None, None),
            (Some("a*"), None, None),
            (None, Some("0"), None),
            (None, Some("1001"), None),
            (None, Some("ten"), None),
            (None, None, Some("")),
            (None, None, Some("not-a-cursor")),
        ] {
            assert_eq!(
                kind(ListRequest::parse(
                    Kind::Lock,
                    query(prefix, limit, cursor),
                    &every
                )),
                Some(problem::Kind::InvalidRequest),
                "{prefix:?} {limit:?} {cursor:?}"
            );
        }
        let key = ListScope::Under(vec!["b:".into(), "a:".into(), "bad prefix".into()]);
        let mine = ListRequest::parse(Kind::Lock, query(None, None, None), &key).expect("own");
        let walked: Vec<&str> = mine.prefixes.iter().map(NamePrefix::as_str).collect();
        assert_eq!(walked, ["a:", "b:"]);
        assert_eq!(
            kind(ListRequest::parse(
                Kind::Lock,
                query(Some("c:"), None, None),
                &key
            )),
            Some(problem::Kind::Forbidden)
        );
        // A cursor of one listing serves no other.
        let next = mine
            .next_cursor(Some((1, Position::Start)))
            .expect("cursor");
        let again = ListRequest::parse(Kind::Lock, query(None, None, Some(&next)), &key)
            .expect("its own cursor");
        assert_eq!(again.from, (1, Position::Start));
        for (other, prefix) in [(Kind::Semaphore, None), (Kind::Lock, Some("a:"))] {
            assert_eq!(
                kind(ListRequest::parse(
                    other,
                    query(prefix, None, Some(&next)),
                    &key
                )),
                Some(problem::Kind::InvalidRequest)
            );
        }
    }
}
