# DDP_SANITIZE=address,undefined (or thread) instruments every target; set globally so that
# libraries and tests agree. UBSan findings abort the test instead of printing and going on.
if(DDP_SANITIZE)
  message(STATUS "ddprun: sanitizers ${DDP_SANITIZE}")
  add_compile_options(-fsanitize=${DDP_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${DDP_SANITIZE})
endif()
