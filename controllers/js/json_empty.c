/* The json controller's empty.c, compiled into this controller (its sources stay in controllers/json). */
#include "../json/empty.c"
