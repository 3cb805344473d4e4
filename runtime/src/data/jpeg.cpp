// JPEG through libjpeg-turbo. libjpeg reports a fatal error by calling error_exit, whose
// default ends the process; ours longjmps back to the function that set the jump point,
// which then throws an InputError naming the file; so do the warnings that mean the image
// data are damaged (corrupts_pixels below), which libjpeg itself only prints. A longjmp must not cross a live C++
// object, so the functions that call libjpeg (the *_steps below) hold only C structs and
// raw pointers; the Tensor they fill is created by their caller.
#include "tarantella/imagenet.hpp"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

}  // namespace

JpegSize jpeg_size(const uint8_t* data, size_t size, const std::string& name) {
  check_start_marker(data, size, name);
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  install(err);
  cinfo.err = &err.pub;
  jpeg_create_decompress(&cinfo);
  Header header;
  bool ok = start_steps(&cinfo, &err, data, size, 0, &header);
  jpeg_destroy_decompress(&cinfo);
  if (!ok) TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, err.message);
  return {header.height, header.width};
}

Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int scale_denom) {
  TNT_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
            "decode_jpeg: scale_denom {} is not 1, 2, 4 or 8", scale_denom);
  check_start_marker(data, size, name);
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  install(err);
  cinfo.err = &err.pub;
  jpeg_create_decompress(&cinfo);
  Header header;
  if (!start_steps(&cinfo, &err, data, size, scale_denom, &header)) {
    jpeg_destroy_decompress(&cinfo);
    TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, err.message);
  }
  const int64_t h = header.height, w = header.width, ch = header.channels;
  Tensor raw = Tensor::empty({h, w, ch}, DType::u8);  // (H, W, 3 or 4)
  if (!scanline_steps(&cinfo, &err, raw.data<uint8_t>(), static_cast<size_t>(w * ch))) {
    jpeg_destroy_decompress(&cinfo);
    TNT_INPUT_ERROR("image '{}': cannot decode JPEG: {}", name, err.message);
  }
  jpeg_destroy_decompress(&cinfo);
  if (ch == 3) return raw;

  // CMYK -> RGB. Adobe's files store inverted CMYK (255 = no ink), which libjpeg passes
  // through, so R = C * K / 255 with the stored values; plain CMYK is inverted first.
  Tensor rgb = Tensor::empty({h, w, 3}, DType::u8);  // (H, W, 3)
  const uint8_t* src = raw.data<uint8_t>();
  uint8_t* dst = rgb.data<uint8_t>();
  for (int64_t p = 0; p < h * w; ++p) {
    int c[4];
    for (int k = 0; k < 4; ++k) c[k] = header.inverted_cmyk ? src[4 * p + k] : 255 - src[4 * p + k];
    for (int k = 0; k < 3; ++k) dst[3 * p + k] = static_cast<uint8_t>((c[k] * c[3] + 127) / 255);
  }
  return rgb;
}

std::vector<uint8_t> encode_jpeg(const Tensor& rgb, int quality) {
  TNT_CHECK(rgb.defined() && rgb.device().is_cpu() && rgb.dtype() == DType::u8 && rgb.ndim() == 3 &&
                rgb.dim(2) == 3,
            "encode_jpeg: expected a host u8 (H, W, 3) tensor, got {}", rgb.str());
  TNT_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality {} is not in [1, 100]", quality);
  TNT_CHECK(rgb.dim(0) > 0 && rgb.dim(1) > 0 && rgb.dim(0) <= 65500 && rgb.dim(1) <= 65500,
            "encode_jpeg: size {} is outside JPEG's limits", rgb.str());
  jpeg_compress_struct cinfo;
  ErrorManager err;
  install(err);
  cinfo.err = &err.pub;
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long buffer_size = 0;
  bool ok = encode_steps(&cinfo, &err, rgb.data<uint8_t>(), static_cast<int>(rgb.dim(0)),
                         static_cast<int>(rgb.dim(1)), quality, &buffer, &buffer_size);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out;
  if (ok) out.assign(buffer, buffer + buffer_size);
  std::free(buffer);
  if (!ok) TNT_THROW("encode_jpeg: {}", err.message);
  return out;
}

}  // namespace tnt
