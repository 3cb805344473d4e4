// Writing JPEGs with libjpeg directly, for tests that need what encode_jpeg does not write
// (4:2:0 RGB only): CMYK, grayscale, other chroma samplings, progressive files.
// Test-only code: a libjpeg error here simply ends the test.
#pragma once

#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstdlib>
#include <vector>

#include <jpeglib.h>

namespace tnt::test {

struct JpegLayout {
  int components = 3;          // 1 grayscale, 3 RGB, 4 CMYK
  int h_samp = 2, v_samp = 2;  // the first component's sampling factors (the others 1)
  bool progressive = false;
  int quality = 90;
};

// pixels: (h, w, components) bytes.
inline std::vector<uint8_t> write_jpeg(const std::vector<uint8_t>& pixels, int h, int w, const JpegLayout& l) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = l.components;
  cinfo.in_color_space = l.components == 1 ? JCS_GRAYSCALE : l.components == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, l.quality, TRUE);
  if (l.components == 3) {
    cinfo.comp_info[0].h_samp_factor = l.h_samp;
    cinfo.comp_info[0].v_samp_factor = l.v_samp;
  }
  if (l.progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + static_cast<size_t>(cinfo.next_scanline) * w * l.components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

}  // namespace tnt::test
