//! Small serde helpers for the hand-written admin JSON visitors: field names
//! matched without allocating, strings borrowed from the body, and seeds for
//! optional values and arrays (so that state can be threaded down).

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// A map key: its index in the given field names, `None` for any other key.
pub struct Field(pub &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Field {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for Field {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|name| *name == v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|name| name.as_bytes() == v))
    }
}

/// A map key compared with one name (e.g. the metadata namespace).
pub struct KeyIs<'k>(pub &'k str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<bool, E> {
        Ok(v == self.0.as_bytes())
    }
}

/// Errors like derive's when a field comes twice.
pub fn once<T, E: de::Error>(seen: &Option<T>, name: &'static str) -> Result<(), E> {
    match seen {
        Some(_) => Err(E::duplicate_field(name)),
        None => Ok(()),
    }
}

/// A JSON string, borrowed from the body unless it has escapes.
#[derive(Debug)]
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(PhantomData))
    }
}

struct StrVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
    type Value = Str<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
        Ok(Str(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
        Ok(Str(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'a>, E> {
        Ok(Str(Cow::Owned(v)))
    }
}

/// `null` (or absent) as `None`, anything else through the seed, as
/// `Option<T>` does for a plain `T`.
pub struct OptionOf<S>(pub S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for OptionOf<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for OptionOf<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an optional value")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// An array whose every element goes through `&mut S` (which keeps what
/// it needs of each), instead of being collected into a `Vec`.
pub struct Each<'s, S>(pub &'s mut S);

impl<'de, S> DeserializeSeed<'de> for Each<'_, S>
where
    for<'x> &'x mut S: DeserializeSeed<'de, Value = ()>,
{
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, S> Visitor<'de> for Each<'_, S>
where
    for<'x> &'x mut S: DeserializeSeed<'de, Value = ()>,
{
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(&mut *self.0)?.is_some() {}
        Ok(())
    }
}
