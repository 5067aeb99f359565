//! A bitmap backend for plotters that draws its text with a pure-Rust
//! rasteriser (ab_glyph) from a font shipped with `lh`.
//!
//! Plotters' own bitmap text needs either system font libraries (its `ttf`
//! feature: fontconfig, freetype) or its `ab_glyph` feature, which would
//! change how every other crate of the workspace that uses plotters lays
//! out text (features are unified across a build) and make their charts
//! fail without a registered font. Wrapping the backend keeps the choice
//! here.

use ab_glyph::{Font as _, FontRef, PxScale, ScaleFont as _};
use plotters::backend::{BitMapBackend, DrawingBackend};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

/// DejaVu Sans cut down to Basic Latin and a few signs; see
/// assets/DejaVuSans-LICENSE.txt.
pub const FONT_TTF: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// [`BitMapBackend`] with text drawn from [`FONT_TTF`].
pub struct GlyphBitmap<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> GlyphBitmap<'a> {
    /// Draws on an RGB buffer of `w × h × 3` bytes.
    pub fn with_buffer(buf: &'a mut [u8], size: (u32, u32)) -> Self {
        GlyphBitmap {
            inner: BitMapBackend::with_buffer(buf, size),
            font: FontRef::try_from_slice(FONT_TTF).expect("the shipped font parses"),
        }
    }

    /// Width of the text's advance and the font's line height, in pixels.
    fn measure(&self, text: &str, size: f64) -> (f32, f32, f32) {
        let font = self.font.as_scaled(PxScale::from(size as f32));
        let mut width = 0.0;
        let mut prev = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                width += font.kern(p, id);
            }
            width += font.h_advance(id);
            prev = Some(id);
        }
        (width, font.ascent(), font.descent())
    }
}

type Error = DrawingErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;

impl DrawingBackend for GlyphBitmap<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Error> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Error> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Error> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Error> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Error> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Error> {
        self.inner.fill_polygon(vert, style)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), Error> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let size = style.size();
        let (width, ascent, descent) = self.measure(text, size);
        let height = ascent - descent;
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Right => -width,
            HPos::Center => -width / 2.0,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let (w, h) = self.get_size();
        let font = self.font.as_scaled(PxScale::from(size as f32));
        let mut caret = 0.0;
        let mut prev = None;
        let mut pixels = Vec::new();
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                caret += font.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(
                PxScale::from(size as f32),
                ab_glyph::point(caret + dx, ascent + dy),
            );
            caret += font.h_advance(id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                outline.draw(|x, y, coverage| {
                    let (x, y) = (
                        bounds.min.x as i32 + x as i32,
                        bounds.min.y as i32 + y as i32,
                    );
                    pixels.push((x, y, coverage));
                });
            }
        }
        for (x, y, coverage) in pixels {
            let (x, y) = transform.transform(x, y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h && coverage > 0.0 {
                self.inner.draw_pixel(
                    (x, y),
                    BackendColor {
                        alpha: color.alpha * f64::from(coverage.min(1.0)),
                        rgb: color.rgb,
                    },
                )?;
            }
        }
        Ok(())
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), Error> {
        let (width, ascent, descent) = self.measure(text, style.size());
        Ok((width.ceil() as u32, (ascent - descent).ceil() as u32))
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Error> {
        self.inner.blit_bitmap(pos, size, src)
    }
}
