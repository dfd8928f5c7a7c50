// The engine's enums and parameter structs, bound from the X-macro lists of the generated
// fastload_abi.h (one definition: fastload/engine_abi.py), so the Python and C++ sides cannot drift
// apart. Enums are enum.IntEnum classes (pybind11's native_enum), like those of engine_abi.py:
// members compare equal to their ints and to the Python-side members. Structs are plain classes
// with typed fields (a wrong type is a TypeError at the boundary), field-wise __eq__, and a __repr__
// in Python syntax.
#include <pybind11/native_enum.h>

#include <iomanip>
#include <sstream>
#include <type_traits>

#include "glue/glue.h"

namespace fastload {
namespace glue {
namespace {

std::string upper(const char* name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

// __repr__ of the structs: Python syntax, enum members by their Python names. Every overload is
// declared before the container templates, which call them for their elements.
std::string repr_value(bool v) { return v ? "True" : "False"; }

template <typename T, typename std::enable_if<std::is_arithmetic<T>::value, int>::type = 0>
std::string repr_value(T v) {
  std::ostringstream s;
  s << std::setprecision(12) << +v;  // unary + prints uint8_t as a number
  return s.str();
}

// (Enums no struct holds have an unused overload.)
#define FASTLOAD_REPR_ENUM(Enum, doc) \
  [[maybe_unused]] std::string repr_value(Enum v) { return std::string(#Enum ".") + upper(abi_name(v)); }
FASTLOAD_ABI_ENUMS(FASTLOAD_REPR_ENUM)
#undef FASTLOAD_REPR_ENUM

#define FASTLOAD_DECLARE_REPR(Struct, doc) std::string repr_value(const Struct& v);
FASTLOAD_ABI_STRUCTS(FASTLOAD_DECLARE_REPR)
#undef FASTLOAD_DECLARE_REPR

template <typename T, size_t N>
std::string repr_value(const std::array<T, N>& v) {
  std::string out = "[";
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + repr_value(v[i]);
  return out + "]";
}

template <typename T>
std::string repr_value(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + repr_value(v[i]);
  return out + "]";
}

#define FASTLOAD_REPR_FIELD(Struct, field, doc)                             \
  out += std::string(first ? "" : ", ") + #field "=" + repr_value(v.field); \
  first = false;
#define FASTLOAD_DEFINE_REPR(Struct, doc)                               \
  std::string repr_value(const Struct& v) {                             \
    std::string out = #Struct "(";                                      \
    bool first = true;                                                  \
    FASTLOAD_ABI_FIELDS_##Struct(FASTLOAD_REPR_FIELD) return out + ")"; \
  }
FASTLOAD_ABI_STRUCTS(FASTLOAD_DEFINE_REPR)
#undef FASTLOAD_DEFINE_REPR
#undef FASTLOAD_REPR_FIELD

}  // namespace

void register_abi(py::module_& m) {
#define FASTLOAD_BIND_VALUE(Enum, cpp, py_name) .value(py_name, Enum::cpp)
#define FASTLOAD_BIND_ENUM(Enum, doc) \
  py::native_enum<Enum>(m, #Enum, "enum.IntEnum", doc) FASTLOAD_ABI_ENUM_##Enum(FASTLOAD_BIND_VALUE).finalize();
  FASTLOAD_ABI_ENUMS(FASTLOAD_BIND_ENUM)
#undef FASTLOAD_BIND_ENUM
#undef FASTLOAD_BIND_VALUE

#define FASTLOAD_BIND_FIELD(Struct, field, doc) .def_readwrite(#field, &Struct::field, doc)
#define FASTLOAD_BIND_STRUCT(Struct, doc)                                                       \
  py::class_<Struct>(m, #Struct, doc)                                                           \
      .def(py::init<>())                                                                        \
      .def("__repr__", [](const Struct& v) { return repr_value(v); })                           \
      .def(                                                                                     \
          "__eq__", [](const Struct& a, const Struct& b) { return a == b; }, py::is_operator()) \
          FASTLOAD_ABI_FIELDS_##Struct(FASTLOAD_BIND_FIELD);
  FASTLOAD_ABI_STRUCTS(FASTLOAD_BIND_STRUCT)
#undef FASTLOAD_BIND_STRUCT
#undef FASTLOAD_BIND_FIELD
}

}  // namespace glue
}  // namespace fastload
