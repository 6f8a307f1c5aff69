// The argument-error list (arg_errors.def) as the built library sees it, so that a test can check that
// Python's reading of the .def file and the compiled enum agree.
#include "common.h"

extern "C" const char* mindgr_arg_error_name(int code) {
  switch (code) {
#define MINDGR_ARG_ERROR(NAME, CODE, TEXT) \
  case static_cast<int>(mindgr::ArgError::NAME): return #NAME;
#include "arg_errors.def"
#undef MINDGR_ARG_ERROR
    default: return nullptr;
  }
}

extern "C" const char* mindgr_arg_error_text(int code) {
  switch (code) {
#define MINDGR_ARG_ERROR(NAME, CODE, TEXT) \
  case static_cast<int>(mindgr::ArgError::NAME): return TEXT;
#include "arg_errors.def"
#undef MINDGR_ARG_ERROR
    default: return nullptr;
  }
}
