//! The writer of a wire form's spec and status: snake_case keys at any depth, and what
//! TRUST.md §4 says never leaves the cluster masked, both while serde writes (no JSON
//! tree, no copy).

use serde::Serialize;

use super::json::put;

/// Writes `key` with `someField` → `some_field`, only for keys that are plain camelCase
/// identifiers, so data keys such as `hugepages-2Mi` or `nvidia.com/gpu` pass unchanged.
fn write_snake_key<W: ?Sized + std::io::Write>(w: &mut W, key: &[u8]) -> std::io::Result<()> {
    let identifier = key.first().is_some_and(u8::is_ascii_lowercase)
        && key.iter().all(u8::is_ascii_alphanumeric);
    if !identifier {
        return w.write_all(key);
    }
    let mut rest = key;
    while let Some(i) = rest.iter().position(u8::is_ascii_uppercase) {
        w.write_all(&rest[..i])?;
        w.write_all(&[b'_', rest[i].to_ascii_lowercase()])?;
        rest = &rest[i + 1..];
    }
    w.write_all(rest)
}

/// Frames are snake_case (§3): the object's spec and status are written re-keyed, every
/// object key through [`write_snake_key`], at any depth. A formatter for serde_json's
/// writer, so no JSON tree is built: it holds a key until it is whole, then writes it
/// re-keyed. The keys of every type written here are strings.
///
/// Writing a spec, it also hides what TRUST.md §4 says never leaves the cluster: each
/// `env[].value` (unless the admin chose to send them; the `env` of a Runtime, a Tool or
/// an Agent's `runtime`) and the password of a Memory's `url`. It knows where it is by
/// the objects and arrays open around it and the key each is at, so the spec is never
/// copied to be masked.
#[derive(Default)]
struct Snake {
    in_key: bool,
    /// The key being written (its escaped text), and whether it had an escape.
    key: Vec<u8>,
    escaped: bool,
    mask: Option<Mask>,
    /// Each object and array open around what is written, with the key it is at now
    /// (an object's last key; an array has none): only while masking.
    open: Vec<(Open, Key)>,
    /// The string being written, when it is held to be masked.
    held: Option<Held>,
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Object,
    Array,
}

/// The keys masking looks for.
#[derive(Clone, Copy, PartialEq)]
enum Key {
    Env,
    Value,
    Url,
    Other,
}

/// What a spec's wire form hides (TRUST.md §4): a url's password always, env values
/// unless the admin chose to send them.
#[derive(Clone, Copy)]
pub(super) struct Mask {
    pub(super) env_values: bool,
}

/// A string the formatter holds back: an env value (dropped) or a url (its escaped
/// text, written with the password replaced once whole).
enum Held {
    EnvValue,
    Url(Vec<u8>),
}

/// What a masked value is sent as.
pub const MASKED: &str = "***";

/// `url` with the password of its userinfo replaced by [`MASKED`]: the user name,
/// host, port, path and query stay (`redis://default:***@redis:6379/0`). Text without
/// a scheme's `://` or without a password passes unchanged.
///
/// A typed password may hold what a URL should have escaped (`/`, `?`, `#`, `@`: a
/// base64 one often holds `/`), so the userinfo is taken to end at the *last* `@`, and
/// the password to start at the first `:` after the scheme: nothing of such a password
/// is shown. The price, an `@` after the host (`redis://h:6379/0?to=a@b`) hides what
/// lies between the first `:` and it, is paid for safety.
pub fn mask_url_password(url: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Some(scheme_end) = url.windows(3).position(|w| w == b"://") else {
        return url.into();
    };
    let rest = scheme_end + 3;
    let Some(at) = url[rest..].iter().rposition(|&b| b == b'@') else {
        return url.into();
    };
    let Some(colon) = url[rest..rest + at].iter().position(|&b| b == b':') else {
        return url.into();
    };
    let mut out = Vec::with_capacity(url.len());
    out.extend_from_slice(&url[..rest + colon + 1]);
    out.extend_from_slice(MASKED.as_bytes());
    out.extend_from_slice(&url[rest + at..]);
    out.into()
}

impl Snake {
    /// Whether the string about to be written is held, and how: a spec's top-level
    /// `url`, or the `value` of an object in an array at key `env`.
    fn hold(&self) -> Option<Held> {
        let mask = self.mask?;
        let at = |back: usize| self.open.len().checked_sub(back).map(|i| self.open[i]);
        match (at(1), at(2), at(3)) {
            (Some((Open::Object, Key::Url)), None, None) => Some(Held::Url(Vec::new())),
            (
                Some((Open::Object, Key::Value)),
                Some((Open::Array, _)),
                Some((Open::Object, Key::Env)),
            ) if mask.env_values => Some(Held::EnvValue),
            _ => None,
        }
    }

    fn enter(&mut self, open: Open) {
        if self.mask.is_some() {
            self.open.push((open, Key::Other));
        }
    }

    fn leave(&mut self) {
        self.open.pop();
    }
}

impl serde_json::ser::Formatter for Snake {
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.enter(Open::Object);
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.leave();
        w.write_all(b"}")
    }

    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.enter(Open::Array);
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.leave();
        w.write_all(b"]")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.in_key = true;
        self.escaped = false;
        self.key.clear();
        Ok(())
    }

    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.in_key = false;
        w.write_all(b"\"")?;
        // An escaped key is no plain identifier: it passes unchanged.
        if self.escaped {
            w.write_all(&self.key)?;
        } else {
            write_snake_key(w, &self.key)?;
        }
        if let Some((_, key)) = self.open.last_mut() {
            *key = match (self.escaped, self.key.as_slice()) {
                (false, b"env") => Key::Env,
                (false, b"value") => Key::Value,
                (false, b"url") => Key::Url,
                _ => Key::Other,
            };
        }
        w.write_all(b"\"")
    }

    fn begin_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        if self.in_key {
            return Ok(());
        }
        self.held = self.hold();
        w.write_all(b"\"")
    }

    fn end_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        if self.in_key {
            return Ok(());
        }
        match self.held.take() {
            Some(Held::EnvValue) => w.write_all(MASKED.as_bytes())?,
            Some(Held::Url(text)) => w.write_all(&mask_url_password(&text))?,
            None => {}
        }
        w.write_all(b"\"")
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if self.in_key {
            self.key.extend_from_slice(fragment.as_bytes());
            return Ok(());
        }
        match &mut self.held {
            Some(Held::EnvValue) => Ok(()),
            Some(Held::Url(text)) => {
                text.extend_from_slice(fragment.as_bytes());
                Ok(())
            }
            None => w.write_all(fragment.as_bytes()),
        }
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CompactFormatter;
        if self.in_key {
            self.escaped = true;
            return CompactFormatter.write_char_escape(&mut self.key, escape);
        }
        match &mut self.held {
            Some(Held::EnvValue) => Ok(()),
            Some(Held::Url(text)) => CompactFormatter.write_char_escape(text, escape),
            None => CompactFormatter.write_char_escape(w, escape),
        }
    }
}

/// Appends `value` as JSON with snake_case keys (`null` if it cannot be written: a map
/// with keys that are not strings, which no type written here has).
pub(super) fn write_snake<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    write_snake_with(out, value, None);
}

/// As [`write_snake`], hiding what `mask` says (a spec's wire form).
pub(super) fn write_snake_with<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    mask: Option<Mask>,
) {
    let start = out.len();
    let snake = Snake {
        mask,
        ..Snake::default()
    };
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, snake);
    if value.serialize(&mut ser).is_err() {
        out.truncate(start);
        put(out, b"null");
    }
}
