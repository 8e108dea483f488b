#include "quill.h"

const char *quill_version(void) { return QUILL_VERSION; }
