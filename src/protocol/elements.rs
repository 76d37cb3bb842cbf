//! The elements of a JSON array of frames (a report's answer, PROTOCOL.md §8) found one
//! at a time, each decoded on its own.

/// The elements of the JSON array `text`, each as its own text, found without building
/// a tree of the whole: 16 MiB of `[0,0,…]` would be a tree of hundreds of MiB. Only
/// the array's frame is checked here (strings and escapes, nesting, commas); each
/// element is decoded on its own, and refused past the frame limit like a WebSocket
/// message. Yields an error, then stops, where the structure breaks.
pub struct Elements<'a> {
    text: &'a str,
    pos: usize,
    done: bool,
}

impl<'a> Elements<'a> {
    pub fn new(text: &'a str) -> Elements<'a> {
        let trimmed = text.trim_start();
        let pos = text.len() - trimmed.len();
        let (pos, done) = match trimmed.as_bytes().first() {
            Some(b'[') => match trimmed[1..].trim_start().as_bytes().first() {
                // `[]`: no element; the tail is checked below.
                Some(b']') => (text.len() - trimmed[1..].trim_start().len() + 1, true),
                _ => (pos + 1, false),
            },
            _ => (usize::MAX, false),
        };
        Elements { text, pos, done }
    }

    /// Checks the whole array's structure, building nothing; the number of elements.
    pub fn count(text: &str) -> Result<usize, &'static str> {
        let mut n = 0;
        let mut it = Elements::new(text);
        for e in &mut it {
            e?;
            n += 1;
        }
        if it.pos == usize::MAX {
            return Err("not a JSON array");
        }
        if !text[it.pos..].trim().is_empty() {
            return Err("text after the array");
        }
        Ok(n)
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Result<&'a str, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.pos == usize::MAX {
            return None;
        }
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            let last = match b {
                b'"' => {
                    in_string = true;
                    continue;
                }
                b'[' | b'{' => {
                    depth += 1;
                    continue;
                }
                b']' | b'}' if depth > 0 => {
                    depth -= 1;
                    continue;
                }
                b']' => true,
                b'}' => break,
                b',' if depth == 0 => false,
                _ => continue,
            };
            let element = self.text[start..i].trim();
            self.pos = i + 1;
            self.done = last;
            if element.is_empty() {
                self.done = true;
                return Some(Err("an empty element"));
            }
            return Some(Ok(element));
        }
        self.done = true;
        Some(Err("unbalanced or unterminated array"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(text: &str) -> Result<Vec<&str>, &'static str> {
        Elements::count(text)?;
        Elements::new(text).collect()
    }

    #[test]
    fn the_elements_of_an_answer_are_found_without_a_tree() {
        assert_eq!(elements("[]"), Ok(vec![]));
        assert_eq!(elements(" [ ] \n"), Ok(vec![]));
        assert_eq!(elements("[1]"), Ok(vec!["1"]));
        assert_eq!(
            elements(r#" [ {"a":[1,{"b":"],}"}]} , "x\",]" ,[[]],null ] "#),
            Ok(vec![
                r#"{"a":[1,{"b":"],}"}]}"#,
                r#""x\",]""#,
                "[[]]",
                "null"
            ])
        );
        // Every element is exactly what serde_json sees as one.
        let text = r#"[{"type":"resync"},{"type":"control","id":"a,b]","target":{"k":[1,2]}}]"#;
        let values: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
        let found = elements(text).unwrap();
        assert_eq!(found.len(), values.len());
        for (f, v) in found.iter().zip(&values) {
            assert_eq!(&serde_json::from_str::<serde_json::Value>(f).unwrap(), v);
        }
        for bad in [
            "",
            "{}",
            "1",
            "[",
            "[1",
            "[1,]",
            "[,1]",
            "[1,,2]",
            "[}",
            "[{]",
            "[1]]",
            "[1] x",
            r#"["unterminated]"#,
            "[{\"a\":1}}]",
        ] {
            assert!(elements(bad).is_err(), "{bad:?} passed as an array");
        }
    }
}
