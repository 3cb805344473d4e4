// JPEG through libjpeg-turbo. libjpeg reports a fatal error by calling error_exit, whose
// default ends the process; ours longjmps back to the function that set the jump point,
// which then throws an InputError naming the file; so do the warnings that mean the image
// data are damaged (corrupts_pixels below), which libjpeg itself only prints. A longjmp must not cross a live C++
// object, so the functions that call libjpeg (the *_steps below) hold only C structs and
// raw pointers; the Tensor they fill is created by their caller.
#include "tarantella/imagenet.hpp"
#include "data/jpeg_region.hpp"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <jpeglib.h>
#include <jerror.h>  // the JWRN_ codes of the warnings

namespace tnt {
namespace {

// The largest image decoded: 2^27 pixels (11585 x 11585; 384 MiB as RGB). A JPEG of a few
// hundred bytes can declare 65535 x 65535 pixels, and a progressive one makes libjpeg hold
// the whole image's coefficients; believing such a header costs gigabytes per worker.
// ImageNet's largest images are a few tens of megapixels.
constexpr uint64_t kMaxJpegPixels = uint64_t{1} << 27;

struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg's warnings that mean the pixels are not the file's: the data end early (libjpeg
// pads the rest with grey), a bad entropy code, a lost restart marker, an inconsistent
// progressive sequence. They are errors, as in PIL ("image file is truncated") and
// TensorFlow: a damaged file must not train silently. The other warnings (extraneous bytes
// between markers, an unknown JFIF version or Adobe transform, a bad ICC profile) leave the
// image intact and are not printed: a run over a million files must not flood stderr.
bool corrupts_pixels(int msg_code) {
  switch (msg_code) {
    case JWRN_JPEG_EOF:          // "Premature end of JPEG file"
    case JWRN_HIT_MARKER:        // "Corrupt JPEG data: premature end of data segment"
    case JWRN_HUFF_BAD_CODE:     // "Corrupt JPEG data: bad Huffman code"
    case JWRN_ARITH_BAD_CODE:    // "Corrupt JPEG data: bad arithmetic code"
    case JWRN_MUST_RESYNC:       // "Corrupt JPEG data: found marker ... instead of RST..."
    case JWRN_BOGUS_PROGRESSION: // "Inconsistent progression sequence ..."
    case JWRN_NOT_SEQUENTIAL:    // "Invalid SOS parameters for sequential JPEG"
      return true;
    default:
      return false;
  }
}

// msg_level -1 is a warning, 0 and up trace messages (never printed).
void on_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;
  if (corrupts_pixels(cinfo->err->msg_code)) on_error(cinfo);
  ++cinfo->err->num_warnings;
}

void install(ErrorManager& err) {
  jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.message[0] = '\0';
}

struct Header {
  int height = 0;
  int width = 0;
  int channels = 0;  // 3 (RGB) or 4 (CMYK, converted by us)
  bool inverted_cmyk = false;
};

// Reads the header and starts decompression. Returns false (message in err) on an error.
// scale_denom 0: the header only (no decompression started).
bool start_steps(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data, size_t size,
                 int scale_denom, Header* header) {
  if (setjmp(err->jump)) return false;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  if (scale_denom == 0) {
    header->height = static_cast<int>(cinfo->image_height);
    header->width = static_cast<int>(cinfo->image_width);
    return true;
  }
  if (uint64_t{cinfo->image_width} * cinfo->image_height > kMaxJpegPixels) {
    std::snprintf(err->message, sizeof err->message, "%u x %u pixels is more than the limit of %llu pixels",
                  cinfo->image_width, cinfo->image_height, static_cast<unsigned long long>(kMaxJpegPixels));
    return false;
  }
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(scale_denom);
  // Where a progressive file lacks some AC coefficients, libjpeg guesses them from the
  // neighbouring blocks' DC values ("block smoothing"), which a part decode
  // (decode_jpeg_region) has only inside its columns. Off, so that a part is the whole
  // image's pixels; complete files are not affected, and files that end early are refused
  // anyway (the fuzz target found an arithmetic-coded one that does not say so).
  cinfo->do_block_smoothing = FALSE;
  // libjpeg converts YCbCr and grayscale to RGB itself, but not CMYK/YCCK (a few ImageNet
  // training files are CMYK): those come out as CMYK and are converted in decode_jpeg.
  if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
    cinfo->out_color_space = JCS_CMYK;
    header->channels = 4;
    header->inverted_cmyk = cinfo->saw_Adobe_marker;
  } else {
    cinfo->out_color_space = JCS_RGB;
    header->channels = 3;
  }
  jpeg_start_decompress(cinfo);
  header->height = static_cast<int>(cinfo->output_height);
  header->width = static_cast<int>(cinfo->output_width);
  return true;
}

// out: (H, W, channels)
bool scanline_steps(jpeg_decompress_struct* cinfo, ErrorManager* err, uint8_t* out, size_t row_bytes) {
  if (setjmp(err->jump)) return false;
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + static_cast<size_t>(cinfo->output_scanline) * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

// Narrows the decoded columns to at least [*left, *left + *cols) (libjpeg moves *left to a
// block boundary and widens *cols). Before any scanline is read.
bool crop_steps(jpeg_decompress_struct* cinfo, ErrorManager* err, JDIMENSION* left, JDIMENSION* cols) {
  if (setjmp(err->jump)) return false;
  if (*left == 0 && *cols == cinfo->output_width) return true;
  jpeg_crop_scanline(cinfo, left, cols);
  return true;
}

// Rows [top, top + rows) into out (rows, output_width, channels); the rows above and below
// are skipped: entropy decoded, not reconstructed. libjpeg skips to the end without reading
// anything, and its finish then steps over the rest of the data to the end marker without
// decoding it, so damage there would go unnoticed: the rows below are skipped up to the
// last, which is read (into scratch, one row). Unless !to_end: then the decode stops after
// the rows. With skip false every row is read (those outside into scratch).
bool region_scanline_steps(jpeg_decompress_struct* cinfo, ErrorManager* err, uint8_t* out, size_t row_bytes,
                           JDIMENSION top, JDIMENSION rows, uint8_t* scratch, bool to_end, bool skip) {
  if (setjmp(err->jump)) return false;
  if (!skip) {
    while (cinfo->output_scanline < cinfo->output_height) {
      const JDIMENSION y = cinfo->output_scanline;
      JSAMPROW row = y >= top && y < top + rows ? out + static_cast<size_t>(y - top) * row_bytes : scratch;
      jpeg_read_scanlines(cinfo, &row, 1);
    }
    jpeg_finish_decompress(cinfo);
    return true;
  }
  if (top > 0 && jpeg_skip_scanlines(cinfo, top) != top) {
    std::snprintf(err->message, sizeof err->message, "cannot skip to row %u", top);
    return false;
  }
  for (JDIMENSION r = 0; r < rows; ++r) {
    JSAMPROW row = out + static_cast<size_t>(r) * row_bytes;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      std::snprintf(err->message, sizeof err->message, "row %u cannot be read", top + r);
      return false;
    }
  }
  if (!to_end) {
    jpeg_abort_decompress(cinfo);
    return true;
  }
  const JDIMENSION rest = cinfo->output_height - cinfo->output_scanline;
  if (rest > 1 && jpeg_skip_scanlines(cinfo, rest - 1) != rest - 1) {
    std::snprintf(err->message, sizeof err->message, "cannot skip to the last row");
    return false;
  }
  if (rest > 0 && jpeg_read_scanlines(cinfo, &scratch, 1) != 1) {
    std::snprintf(err->message, sizeof err->message, "the last row cannot be read");
    return false;
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

// Whether a part may be decoded narrowed and skipped to (decode_jpeg_region): every
// component sampled 1 or 2 times in each direction, or 4 across and 1 down (4:1:1).
bool narrowable(const jpeg_decompress_struct& cinfo) {
  for (int c = 0; c < cinfo.num_components; ++c) {
    const int h = cinfo.comp_info[c].h_samp_factor, v = cinfo.comp_info[c].v_samp_factor;
    if (!((h <= 2 && v <= 2) || (h == 4 && v == 1))) return false;
  }
  return true;
}

// CMYK (pixels, 4) -> RGB (pixels, 3). Adobe's files
// store inverted CMYK (255 = no ink), which libjpeg passes through, so R = C * K / 255 with
// the stored values; plain CMYK is inverted first.
void cmyk_to_rgb(const uint8_t* src, uint8_t* dst, int64_t pixels, bool inverted) {
  for (int64_t p = 0; p < pixels; ++p) {
    int c[4];
    for (int k = 0; k < 4; ++k) c[k] = inverted ? src[4 * p + k] : 255 - src[4 * p + k];
    for (int k = 0; k < 3; ++k) dst[3 * p + k] = static_cast<uint8_t>((c[k] * c[3] + 127) / 255);
  }
}

// rgb: (H, W, 3). *out is malloc'ed by libjpeg (freed by the caller, also after an error).
bool encode_steps(jpeg_compress_struct* cinfo, ErrorManager* err, const uint8_t* rgb, int height, int width,
                  int quality, unsigned char** out, unsigned long* out_size) {
  if (setjmp(err->jump)) return false;
  jpeg_mem_dest(cinfo, out, out_size);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  cinfo->input_components = 3;
  cinfo->in_color_space = JCS_RGB;
  jpeg_set_defaults(cinfo);
  jpeg_set_quality(cinfo, quality, TRUE);
  jpeg_start_compress(cinfo, TRUE);
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb) + static_cast<size_t>(cinfo->next_scanline) * width * 3;
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

void check_start_marker(const uint8_t* data, size_t size, const std::string& name) {
  // The SOI marker check gives a plain message for the common case (a PNG or a text file
  // with a .JPEG name) instead of libjpeg's "Not a JPEG file: starts with 0x89 0x50".
  if (size < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF)
    TNT_INPUT_ERROR("image '{}': not a JPEG file ({} bytes, no JPEG start marker)", name, size);
}

bool create_steps(jpeg_decompress_struct* cinfo, ErrorManager* err) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(cinfo);
  return true;
}

bool create_steps(jpeg_compress_struct* cinfo, ErrorManager* err) {
  if (setjmp(err->jump)) return false;
  jpeg_create_compress(cinfo);
  return true;
}

// libjpeg's state with its error manager, destroyed however the function holding it ends
// (an InputError, a failed allocation of the output). Created through a step: creating can
// fail too (out of memory). Never copied or moved: cinfo points at err.
template <class Struct, void (*Destroy)(Struct*)>
struct Codec {
  Struct cinfo;
  ErrorManager err;
  bool live = false;
  Codec() {
    install(err);
    cinfo.err = &err.pub;
    live = create_steps(&cinfo, &err);
    if (!live) TNT_THROW("libjpeg: {}", err.message);
  }
  ~Codec() {
    if (live) Destroy(&cinfo);
  }
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;
};
void destroy_decompress(jpeg_decompress_struct* c) { jpeg_destroy_decompress(c); }
void destroy_compress(jpeg_compress_struct* c) { jpeg_destroy_compress(c); }
using Decompressor = Codec<jpeg_decompress_struct, destroy_decompress>;
using Compressor = Codec<jpeg_compress_struct, destroy_compress>;

}  // namespace

JpegSize jpeg_size(const uint8_t* data, size_t size, const std::string& name) {
  check_start_marker(data, size, name);
  Decompressor d;
  Header header;
  if (!start_steps(&d.cinfo, &d.err, data, size, 0, &header))
    TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, d.err.message);
  return {header.height, header.width};
}

Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int scale_denom) {
  TNT_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
            "decode_jpeg: scale_denom {} is not 1, 2, 4 or 8", scale_denom);
  check_start_marker(data, size, name);
  Decompressor d;
  Header header;
  if (!start_steps(&d.cinfo, &d.err, data, size, scale_denom, &header))
    TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, d.err.message);
  const int64_t h = header.height, w = header.width, ch = header.channels;
  Tensor raw = Tensor::empty({h, w, ch}, DType::u8);  // (H, W, 3 or 4)
  if (!scanline_steps(&d.cinfo, &d.err, raw.data<uint8_t>(), static_cast<size_t>(w * ch)))
    TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, d.err.message);
  if (ch == 3) return raw;

  Tensor rgb = Tensor::empty({h, w, 3}, DType::u8);  // (H, W, 3)
  cmyk_to_rgb(raw.data<uint8_t>(), rgb.data<uint8_t>(), h * w, header.inverted_cmyk);
  return rgb;
}

namespace detail {

JpegRegion decode_jpeg_region(const uint8_t* data, size_t size, const std::string& name, int scale_denom,
                              int64_t top, int64_t rows, int64_t left, int64_t cols, bool to_end) {
  TNT_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
            "decode_jpeg_region: scale_denom {} is not 1, 2, 4 or 8", scale_denom);
  check_start_marker(data, size, name);
  Decompressor d;
  jpeg_decompress_struct& cinfo = d.cinfo;
  Header header;
  auto fail = [&]() { TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, d.err.message); };
  if (!start_steps(&cinfo, &d.err, data, size, scale_denom, &header)) fail();
  const int64_t h = header.height, w = header.width, ch = header.channels;
  if (top < 0 || rows < 1 || top + rows > h || left < 0 || cols < 1 || left + cols > w) {
    TNT_THROW("decode_jpeg_region: rows [{}, {}) and columns [{}, {}) are not inside image '{}' ({} x {} at 1/{})",
              top, top + rows, left, left + cols, name, h, w, scale_denom);
  }
  // Arithmetic-coded files (rare: few encoders write them) are decoded whole and cut: with
  // damaged data libjpeg-turbo's skipping gave other pixels than the whole decode (found by
  // the fuzz target, a progressive arithmetic-coded file).
  if (cinfo.arith_code) {
    const Tensor whole = decode_jpeg(data, size, name, scale_denom);  // (h, w, 3)
    Tensor part = Tensor::empty({rows, w, 3}, DType::u8);  // (rows, w, 3)
    std::memcpy(part.data<uint8_t>(), whole.data<uint8_t>() + top * w * 3, static_cast<size_t>(rows * w * 3));
    return {std::move(part), 0};
  }
  // Fancy upsampling (the default) computes an edge pixel of subsampled chroma from the
  // sample beyond it, which a narrowed decode does not have: the outermost one or two
  // columns of the narrowed output differ from the whole image's (4:2:0 and 4:2:2 files;
  // rows are not affected). A margin keeps the asked columns exact.
  constexpr int64_t kMargin = 8;
  const int64_t from = std::max<int64_t>(0, left - kMargin), to = std::min<int64_t>(w, left + cols + kMargin);
  JDIMENSION x0 = static_cast<JDIMENSION>(from), xn = static_cast<JDIMENSION>(to - from);
  // libjpeg-turbo 2.1's skipping and narrowing give other pixels than the whole decode (and
  // skipping refuses some valid files) when a component is sampled 4 times in one direction
  // and 2 in the other (2x4, 4x2) at 1/2 and 1/4; only the samplings data_jpeg_region proves
  // exact are narrowed, the others decoded whole (rare: encoders write 4:2:0, 4:2:2, 4:4:4).
  const bool narrow = narrowable(cinfo);
  if (!narrow) x0 = 0, xn = cinfo.output_width;
  if (!crop_steps(&cinfo, &d.err, &x0, &xn)) fail();
  const int64_t dw = cinfo.output_width;  // the decoded columns, [x0, x0 + dw)
  Tensor raw = Tensor::empty({rows, dw, ch}, DType::u8);  // (rows, dw, 3 or 4)
  Tensor scratch = Tensor::empty({dw, ch}, DType::u8);  // (dw, 3 or 4): the last row
  if (!region_scanline_steps(&cinfo, &d.err, raw.data<uint8_t>(), static_cast<size_t>(dw * ch),
                             static_cast<JDIMENSION>(top), static_cast<JDIMENSION>(rows), scratch.data<uint8_t>(),
                             to_end, narrow))
    fail();
  if (ch == 3) return {std::move(raw), static_cast<int64_t>(x0)};
  Tensor rgb = Tensor::empty({rows, dw, 3}, DType::u8);  // (rows, dw, 3)
  cmyk_to_rgb(raw.data<uint8_t>(), rgb.data<uint8_t>(), rows * dw, header.inverted_cmyk);
  return {std::move(rgb), static_cast<int64_t>(x0)};
}

}  // namespace detail

std::vector<uint8_t> encode_jpeg(const Tensor& rgb, int quality) {
  TNT_CHECK(rgb.defined() && rgb.device().is_cpu() && rgb.dtype() == DType::u8 && rgb.ndim() == 3 &&
                rgb.dim(2) == 3,
            "encode_jpeg: expected a host u8 (H, W, 3) tensor, got {}", rgb.str());
  TNT_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality {} is not in [1, 100]", quality);
  TNT_CHECK(rgb.dim(0) > 0 && rgb.dim(1) > 0 && rgb.dim(0) <= 65500 && rgb.dim(1) <= 65500,
            "encode_jpeg: size {} is outside JPEG's limits", rgb.str());
  unsigned char* buffer = nullptr;
  unsigned long buffer_size = 0;
  bool ok = false;
  std::string message;
  {
    Compressor c;
    ok = encode_steps(&c.cinfo, &c.err, rgb.data<uint8_t>(), static_cast<int>(rgb.dim(0)),
                      static_cast<int>(rgb.dim(1)), quality, &buffer, &buffer_size);
    if (!ok) message = c.err.message;
  }  // destroyed before the buffer is freed: libjpeg's destination may still name it
  std::vector<uint8_t> out;
  if (ok) out.assign(buffer, buffer + buffer_size);
  std::free(buffer);
  if (!ok) TNT_THROW("encode_jpeg: {}", message);
  return out;
}

}  // namespace tnt
