//! How payloads become bytes in Redis and back.

use std::borrow::Cow;

pub use crate::error::CodecError;

/// A payload type a queue can carry: how it is encoded into the bytes
/// stored in Redis, and decoded back.
///
/// Implemented for `String` (UTF-8; decoding rejects invalid UTF-8),
/// `Vec<u8>` (bytes as they are) and, with the `serde` feature, for
/// `Json<T>` (serde JSON). Implement it for your own types to use
/// another format.
///
/// ```
/// use std::borrow::Cow;
/// use redwheel::queue::{Codec, CodecError};
///
/// struct OrderId(u64);
///
/// impl Codec for OrderId {
///     fn encode(&self) -> Result<Cow<'_, [u8]>, CodecError> {
///         Ok(Cow::Owned(self.0.to_be_bytes().to_vec()))
///     }
///     fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
///         let raw: [u8; 8] = bytes.try_into()?;
///         Ok(OrderId(u64::from_be_bytes(raw)))
///     }
/// }
/// ```
pub trait Codec: Sized + Send + 'static {
    /// The bytes to store for `self`.
    fn encode(&self) -> Result<Cow<'_, [u8]>, CodecError>;
    /// The value stored as `bytes`.
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;
}

impl Codec for String {
    fn encode(&self) -> Result<Cow<'_, [u8]>, CodecError> {
        Ok(Cow::Borrowed(self.as_bytes()))
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        Ok(String::from_utf8(bytes.to_vec())?)
    }
}

impl Codec for Vec<u8> {
    fn encode(&self) -> Result<Cow<'_, [u8]>, CodecError> {
        Ok(Cow::Borrowed(self.as_slice()))
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        Ok(bytes.to_vec())
    }
}

/// A payload stored as serde JSON: `rw.queue::<Json<Order>>("orders")`.
///
/// Available with the `serde` feature.
///
/// ```no_run
/// use std::time::Duration;
/// use redwheel::{Redwheel, queue::Json};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order {
///     id: u64,
///     sku: String,
/// }
///
/// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
/// let q = rw.queue::<Json<Order>>("orders")?;
/// q.offer(&Json(Order { id: 42, sku: "A-7".into() }), Duration::from_secs(60))?;
/// let Json(order) = q.take()?.into_payload();
/// assert_eq!(order.id, 42);
/// # Ok::<(), redwheel::Error>(())
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Json<T>(pub T);

#[cfg(feature = "serde")]
impl<T> Codec for Json<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    fn encode(&self) -> Result<Cow<'_, [u8]>, CodecError> {
        Ok(Cow::Owned(serde_json::to_vec(&self.0)?))
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        Ok(Json(serde_json::from_slice(bytes)?))
    }
}
