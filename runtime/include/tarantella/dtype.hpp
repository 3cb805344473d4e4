#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tnt {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);        // "f32", "bf16", ...
const char* dtype_safetensors(DType dtype);  // "F32", "BF16", ...
DType dtype_from_name(const std::string& name);  // accepts both spellings; throws otherwise

constexpr bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }
constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || is_half(t); }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

}  // namespace tnt
